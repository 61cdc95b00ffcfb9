//! Tests of the host itself with small hand-written modules (WAT): the ABI answers Envoy gives
//! (shared-data CAS, metrics, queues, maps per phase, unknown imports), timers on the test
//! clock, http calls that pause and resume a stream, and traps reported with a Wasm backtrace.

use crate::{Action, Host, HostError};
use std::time::Duration;

/// A module that calls host functions from exports a test can invoke.
const PROBE: &str = r#"
(module
  (import "env" "proxy_get_shared_data" (func $get (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_set_shared_data" (func $set (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_set_tick_period_milliseconds" (func $tick_period (param i32) (result i32)))
  (import "env" "proxy_get_current_time_nanoseconds" (func $now (param i32) (result i32)))
  (import "env" "proxy_http_call" (func $http_call (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_continue_stream" (func $continue (param i32) (result i32)))
  (import "env" "proxy_get_buffer_bytes" (func $get_buf (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_get_header_map_value" (func $get_header (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_define_metric" (func $define (param i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_increment_metric" (func $inc (param i32 i64) (result i32)))
  (import "env" "proxy_record_metric" (func $record (param i32 i64) (result i32)))
  (import "env" "proxy_get_metric" (func $get_metric (param i32 i32) (result i32)))
  (import "env" "proxy_register_shared_queue" (func $register (param i32 i32 i32) (result i32)))
  (import "env" "proxy_resolve_shared_queue" (func $resolve (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_enqueue_shared_queue" (func $enqueue (param i32 i32 i32) (result i32)))
  (import "env" "proxy_dequeue_shared_queue" (func $dequeue (param i32 i32 i32) (result i32)))
  (import "env" "proxy_made_up_call" (func $made_up (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open" (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (global $heap (mut i32) (i32.const 65536))
  (global $ticks (mut i32) (i32.const 0))
  (global $ready (mut i32) (i32.const 0))
  (data (i32.const 100) "key")
  (data (i32.const 110) "value-1")
  (data (i32.const 120) "cluster_x")
  (data (i32.const 140) "my.counter")
  (data (i32.const 150) "my.gauge")
  (data (i32.const 160) "q")
  (data (i32.const 170) "x-a")
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "_initialize"))
  (func (export "proxy_on_memory_allocate") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32)
    (drop (call $tick_period (i32.const 1000)))
    (i32.const 1))
  (func (export "proxy_on_tick") (param i32)
    (global.set $ticks (i32.add (global.get $ticks) (i32.const 1)))
    (drop (call $now (i32.const 200))))
  (func (export "ticks") (result i32) (global.get $ticks))
  (func (export "last_tick_ms") (result i64) (i64.div_u (i64.load (i32.const 200)) (i64.const 1000000)))
  (func (export "set") (param $cas i32) (result i32)
    (call $set (i32.const 100) (i32.const 3) (i32.const 110) (i32.const 7) (local.get $cas)))
  (func (export "get") (result i32)
    (call $get (i32.const 100) (i32.const 3) (i32.const 300) (i32.const 304) (i32.const 308)))
  (func (export "got_cas") (result i32) (i32.load (i32.const 308)))
  (func (export "got_size") (result i32) (i32.load (i32.const 304)))
  ;; A stream that asks a side service first: pause on headers, resume on the answer.
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (i32.store (i32.const 420)
      (call $get_header (i32.const 2) (i32.const 170) (i32.const 3) (i32.const 424) (i32.const 428)))
    (drop (call $http_call (i32.const 120) (i32.const 9) (i32.const 0) (i32.const 0)
      (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 500) (i32.const 400)))
    (i32.const 1))
  (func (export "resp_map_status") (result i32) (i32.load (i32.const 420)))
  (func (export "proxy_on_http_call_response") (param i32 i32 i32 i32 i32)
    (i32.store (i32.const 440)
      (call $get_buf (i32.const 4) (i32.const 0) (local.get 3) (i32.const 444) (i32.const 448)))
    (drop (call $continue (i32.const 0))))
  (func (export "call_body_size") (result i32) (i32.load (i32.const 448)))
  (func (export "proxy_on_request_body") (param i32 i32 i32) (result i32) (i32.const 1))
  (func (export "define") (param $kind i32) (param $name i32) (param $len i32) (result i32)
    (drop (call $define (local.get $kind) (local.get $name) (local.get $len) (i32.const 500)))
    (i32.load (i32.const 500)))
  (func (export "inc") (param $id i32) (param $d i64) (result i32) (call $inc (local.get $id) (local.get $d)))
  (func (export "record") (param $id i32) (param $v i64) (result i32) (call $record (local.get $id) (local.get $v)))
  (func (export "get_metric") (param $id i32) (result i32) (call $get_metric (local.get $id) (i32.const 510)))
  (func (export "metric_value") (result i64) (i64.load (i32.const 510)))
  (func (export "register") (result i32)
    (drop (call $register (i32.const 160) (i32.const 1) (i32.const 520)))
    (i32.load (i32.const 520)))
  (func (export "resolve_and_enqueue") (result i32)
    (drop (call $resolve (i32.const 0) (i32.const 0) (i32.const 160) (i32.const 1) (i32.const 524)))
    (call $enqueue (i32.load (i32.const 524)) (i32.const 110) (i32.const 7)))
  (func (export "dequeue") (param $id i32) (result i32)
    (call $dequeue (local.get $id) (i32.const 530) (i32.const 534)))
  (func (export "proxy_on_queue_ready") (param i32 i32)
    (global.set $ready (i32.add (global.get $ready) (i32.const 1))))
  (func (export "ready") (result i32) (global.get $ready))
  (func (export "made_up") (result i32) (call $made_up (i32.const 0)))
  (func (export "path_open") (result i32)
    (call $path_open (i32.const 3) (i32.const 0) (i32.const 100) (i32.const 3) (i32.const 0)
      (i64.const 0) (i64.const 0) (i32.const 0) (i32.const 540)))
)
"#;

/// A module whose request callback panics the way a Rust filter does: a message on stderr,
/// then `unreachable`, three named functions deep.
const TRAPS: &str = r#"
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "panicked at src/lib.rs:7: index out of bounds\n")
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "malloc") (param i32) (result i32) (i32.const 4096))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (call $parse_model)
    (i32.const 0))
  (func $parse_model (call $explode))
  (func $explode
    (i32.store (i32.const 0) (i32.const 16))
    (i32.store (i32.const 4) (i32.const 46))
    (drop (call $fd_write (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 8)))
    unreachable)
)
"#;

fn probe() -> Host {
    Host::load(PROBE.as_bytes()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_trap_is_a_failure_with_the_wasm_backtrace_and_what_the_module_printed() {
    let host = Host::load(TRAPS.as_bytes()).unwrap();
    let vm = host.vm("").unwrap();
    let mut req = vm.request();
    let err = req
        .headers(&[(":path", "/")])
        .send()
        .err()
        .expect("the trap must be an error");
    let HostError::Trap {
        callback,
        message,
        backtrace,
        output,
        ..
    } = &err
    else {
        panic!("not a trap: {err}")
    };
    assert!(
        callback.starts_with("proxy_on_request_headers(ctx=2"),
        "{callback}"
    );
    assert!(message.contains("unreachable"), "{message}");
    let explode = backtrace
        .find("explode")
        .expect("backtrace names the trapping function");
    let parse = backtrace
        .find("parse_model")
        .expect("backtrace names its caller");
    assert!(explode < parse, "innermost frame first:\n{backtrace}");
    assert!(output.contains("index out of bounds"), "{output}");
    let text = err.to_string();
    assert!(
        text.contains("wasm backtrace") && text.contains("[host->vm] proxy_on_request_headers"),
        "{text}"
    );
    // Like Envoy, the VM is dead afterwards.
    assert!(vm.is_dead());
    assert!(matches!(
        vm.request().headers(&[(":path", "/")]).send(),
        Err(HostError::VmDead(_))
    ));
}

#[test]
fn shared_data_cas_is_envoys_across_vms() {
    let host = probe();
    let (a, b) = (host.vm("").unwrap(), host.vm("").unwrap());
    assert_eq!(
        a.call_export("get", &[]).unwrap(),
        [1],
        "missing key: NotFound"
    );
    assert_eq!(a.call_export("set", &[0]).unwrap(), [0], "no CAS: Ok");
    assert_eq!(
        b.call_export("get", &[]).unwrap(),
        [0],
        "another VM sees it"
    );
    assert_eq!(b.call_export("got_size", &[]).unwrap(), [7]);
    let cas = b.call_export("got_cas", &[]).unwrap()[0];
    assert_ne!(cas, 0);
    assert_eq!(
        a.call_export("set", &[cas]).unwrap(),
        [0],
        "current CAS: Ok"
    );
    assert_eq!(
        b.call_export("set", &[cas]).unwrap(),
        [8],
        "stale CAS: CasMismatch"
    );
    assert_eq!(
        host.shared_data("key").map(|(v, _)| v),
        Some(b"value-1".to_vec())
    );
    assert_eq!(
        b.call_export("set", &[0]).unwrap(),
        [0],
        "CAS 0 always writes"
    );
}

#[test]
fn ticks_follow_the_test_clock() {
    let host = probe();
    let vm = host.vm("").unwrap();
    assert_eq!(vm.tick_period(), Some(Duration::from_secs(1)));
    let start_ms = host.now_ms();
    assert_eq!(vm.advance(Duration::from_millis(3500)).unwrap(), 3);
    assert_eq!(vm.call_export("ticks", &[]).unwrap(), [3]);
    assert_eq!(
        vm.call_export("last_tick_ms", &[]).unwrap(),
        [start_ms as i64 + 3000],
        "each tick runs at its deadline"
    );
    assert_eq!(host.now_ms(), start_ms + 3500);
    // Another worker moved the clock: the overdue tick fires once.
    host.advance_clock(Duration::from_secs(10));
    assert_eq!(vm.run_timers().unwrap(), 1);
    assert_eq!(vm.run_timers().unwrap(), 0);
}

#[test]
fn an_http_call_pauses_the_stream_until_its_answer_resumes_it() {
    let host = probe();
    let vm = host.vm("").unwrap();
    let mut req = vm.request();
    req.headers(&[(":method", "GET"), (":path", "/x")])
        .body("abc")
        .send()
        .unwrap();
    assert_eq!(
        vm.call_export("resp_map_status", &[]).unwrap(),
        [2],
        "response headers do not exist yet: BadArgument"
    );
    assert!(req.is_paused() && !req.forwarded());
    let calls = vm.http_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        (calls[0].upstream.as_str(), calls[0].timeout_ms),
        ("cluster_x", 500)
    );
    vm.respond_http_call(calls[0].token, &[(":status", "200")], b"allowed")
        .unwrap();
    assert_eq!(vm.call_export("call_body_size", &[]).unwrap(), [7]);
    assert!(
        !req.is_paused() && req.forwarded_complete(),
        "{}",
        req.explain()
    );
    assert_eq!(req.upstream_body(), b"abc");
    assert_eq!(
        req.actions()[0],
        ("request headers".to_string(), Action::Pause)
    );
    assert!(vm.http_calls().is_empty());
    assert!(matches!(
        vm.respond_http_call(99, &[], b""),
        Err(HostError::Usage(_))
    ));
    assert!(vm
        .trace()
        .contains("proxy_on_http_call_response(ctx=2, token=1, headers=1, body=7, trailers=0)"));
}

#[test]
fn metrics_behave_like_envoy_stats() {
    let host = probe();
    let vm = host.vm("").unwrap();
    let counter = vm.call_export("define", &[0, 140, 10]).unwrap()[0];
    let gauge = vm.call_export("define", &[1, 150, 8]).unwrap()[0];
    assert_eq!(vm.call_export("inc", &[counter, 5]).unwrap(), [0]);
    assert_eq!(
        vm.call_export("inc", &[counter, -1]).unwrap(),
        [2],
        "a counter cannot go down"
    );
    assert_eq!(vm.call_export("inc", &[gauge, -3]).unwrap(), [0]);
    assert_eq!(vm.call_export("record", &[gauge, 42]).unwrap(), [0]);
    assert_eq!(
        vm.call_export("inc", &[99, 1]).unwrap(),
        [1],
        "unknown id: NotFound"
    );
    assert_eq!(vm.call_export("get_metric", &[counter]).unwrap(), [0]);
    assert_eq!(vm.call_export("metric_value", &[]).unwrap(), [5]);
    assert_eq!(host.metric("my.gauge").map(|m| m.value), Some(42));
    // A second VM defining the same name shares the stat.
    let vm2 = host.vm("").unwrap();
    let c2 = vm2.call_export("define", &[0, 140, 10]).unwrap()[0];
    vm2.call_export("inc", &[c2, 2]).unwrap();
    assert_eq!(host.metric("my.counter").map(|m| m.value), Some(7));
}

#[test]
fn shared_queues_notify_the_vm_that_registered_them() {
    let host = probe();
    let (owner, other) = (host.vm("").unwrap(), host.vm("").unwrap());
    let id = owner.call_export("register", &[]).unwrap()[0];
    assert_eq!(other.call_export("resolve_and_enqueue", &[]).unwrap(), [0]);
    assert_eq!(other.deliver_queue_events().unwrap(), 0, "not its queue");
    assert_eq!(owner.deliver_queue_events().unwrap(), 1);
    assert_eq!(owner.call_export("ready", &[]).unwrap(), [1]);
    assert_eq!(owner.call_export("dequeue", &[id]).unwrap(), [0]);
    assert_eq!(
        owner.call_export("dequeue", &[id]).unwrap(),
        [7],
        "empty queue: Empty"
    );
    assert_eq!(
        owner.call_export("dequeue", &[id + 5]).unwrap(),
        [1],
        "unknown queue: NotFound"
    );
}

#[test]
fn imports_this_host_does_not_offer_answer_not_implemented() {
    let host = probe();
    assert_eq!(
        host.module().unimplemented_imports(),
        ["env.proxy_made_up_call", "wasi_snapshot_preview1.path_open"]
    );
    let vm = host.vm("").unwrap();
    assert_eq!(
        vm.call_export("made_up", &[]).unwrap(),
        [12],
        "proxy-wasm Unimplemented"
    );
    assert_eq!(
        vm.call_export("path_open", &[]).unwrap(),
        [52],
        "WASI ENOSYS"
    );
    assert!(!vm.is_dead());
}

#[test]
fn modules_that_are_not_proxy_wasm_are_refused_with_a_reason() {
    let e = Host::load(b"(module (memory (export \"memory\") 1))")
        .err()
        .unwrap();
    assert!(e.to_string().contains("proxy_abi_version"), "{e}");
    let e = Host::load(b"\0asm garbage").err().unwrap();
    assert!(matches!(e, HostError::Compile(_)), "{e}");
    let e = crate::Module::from_file(std::path::Path::new("/nonexistent/x.wasm"))
        .err()
        .unwrap();
    assert!(e.to_string().contains("./build.sh"), "{e}");
}

#[test]
fn a_wasi_command_gets_its_arguments_and_its_exit_code_is_returned() {
    let wat = r#"(module
      (import "wasi_snapshot_preview1" "args_sizes_get" (func $sizes (param i32 i32) (result i32)))
      (import "wasi_snapshot_preview1" "args_get" (func $args (param i32 i32) (result i32)))
      (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
      (memory (export "memory") 1)
      (func (export "_start")
        (drop (call $sizes (i32.const 0) (i32.const 4)))
        (drop (call $args (i32.const 16) (i32.const 64)))
        ;; exit code = argc * 10 + first byte of argv[2] - '0'
        (call $exit (i32.add (i32.mul (i32.load (i32.const 0)) (i32.const 10))
          (i32.sub (i32.load8_u (i32.load (i32.const 24))) (i32.const 48))))))"#;
    let m = crate::Module::compile_command(wat.as_bytes()).unwrap();
    let args = ["prog".to_string(), "--flag".to_string(), "7".to_string()];
    assert_eq!(crate::run_command(&m, &args).unwrap(), 37);
    let ok = crate::Module::compile_command(
        br#"(module (memory (export "memory") 1) (func (export "_start")))"#,
    )
    .unwrap();
    assert_eq!(crate::run_command(&ok, &["p".to_string()]).unwrap(), 0);
}
