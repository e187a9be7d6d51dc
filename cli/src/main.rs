/// `k8s4r up` hosts apiserver-lite, which allocates on every request;
/// glibc's malloc spent a fifth of its write path (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    match k8s4r::main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("Error: {error:?}");
            // `k8s4r logs` of a robot it could not ask: what it printed is
            // only the cluster's last output, said by its own exit code.
            if error.downcast_ref::<k8s4r::logs::Partial>().is_some() {
                std::process::ExitCode::from(k8s4r::logs::EXIT_PARTIAL)
            } else {
                std::process::ExitCode::FAILURE
            }
        }
    }
}
