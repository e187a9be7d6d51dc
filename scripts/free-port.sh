# Sourced by the scripts that start servers on loopback: free_port prints a
# port nothing listens on (a connection to it is refused).
free_port() {
    local port
    while :; do
        port=$((20000 + RANDOM % 40000))
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "$port"; return; }
    done
}
