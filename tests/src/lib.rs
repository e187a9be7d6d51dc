//! End-to-end tests of k8s4r: see `tests/e2e.rs`. The library is empty; the
//! package's binary `e2e-agent` is the real agent, run as a process per robot.
