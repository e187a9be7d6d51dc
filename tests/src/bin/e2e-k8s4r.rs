//! The real `k8s4r` command, built in this package so the dashboard tests
//! can run `k8s4r up` and `k8s4r dashboard` as processes (and kill them).

/// The allocator the real program runs with (glibc's malloc took a third
/// of this server's CPU in a 100,000-robot scale bench), so that what the
/// tests and benches measure is what users run.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    k8s4r::program()
}
