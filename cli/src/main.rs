/// `k8s4r up` hosts apiserver-lite, which allocates on every request;
/// glibc's malloc spent a fifth of its write path (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    k8s4r::program()
}
