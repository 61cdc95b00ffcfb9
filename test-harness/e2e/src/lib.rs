//! End-to-end tests of the filter live in `tests/`: each file is one scenario, run against a
//! real Envoy (`--concurrency 2`, so several worker VMs share state) loading the real release
//! `.wasm`, with in-process backends standing in for model-server pods. Build the module first
//! with `./build.sh` (the tests say so when it is missing).
