//! The `model-sim` binary itself: ready lines, the fleet forms (file and `--spec`), serving on
//! the printed addresses, a clean exit on SIGTERM, and an exit when every pod died.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

mod common;

/// Kills the child on drop (by PID, via the handle).
struct Sim {
    child: Child,
    pods: Vec<(SocketAddr, String)>,
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the binary and waits (bounded) for `n` ready lines.
fn start(args: &[&str], n: usize) -> Sim {
    let mut child = Command::new(env!("CARGO_BIN_EXE_model-sim"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn model-sim: {e}"));
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut sim = Sim {
        child,
        pods: Vec::new(),
    };
    while sim.pods.len() < n {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("no ready line: {e}"));
        // model-sim: pod 127.0.0.1:9001 profile=h100 engine=vllm ready
        let parts: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(parts.first(), Some(&"model-sim:"), "{line}");
        assert_eq!(parts.last(), Some(&"ready"), "{line}");
        let addr: SocketAddr = parts[2].parse().unwrap_or_else(|e| panic!("{line}: {e}"));
        sim.pods.push((addr, line.clone()));
    }
    sim
}

fn wait_exit(child: &mut Child) -> Option<std::process::ExitStatus> {
    for _ in 0..200 {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    None
}

#[tokio::test]
async fn spec_fleet_serves_and_exits_on_sigterm() {
    let mut sim = start(
        &["fleet", "--spec", "h100:0,a10g:0:sglang", "--speedup", "20"],
        2,
    );
    assert!(
        sim.pods[0].1.contains("profile=h100 engine=vllm"),
        "{}",
        sim.pods[0].1
    );
    assert!(
        sim.pods[1].1.contains("profile=a10g engine=sglang"),
        "{}",
        sim.pods[1].1
    );
    for (addr, _) in &sim.pods {
        let r = common::http(*addr, "GET", "/health", None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-model-sim-pod"), Some(addr.to_string().as_str()));
    }
    let m = common::http(sim.pods[1].0, "GET", "/metrics", None)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .body;
    assert!(m.contains("sglang:num_queue_reqs"));
    let pid = sim.child.id().to_string();
    let ok = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "kill -TERM");
    let status = wait_exit(&mut sim.child).unwrap_or_else(|| panic!("no exit after SIGTERM"));
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn fleet_file_and_exit_when_every_pod_died() {
    let dir = std::env::temp_dir().join(format!("model-sim-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let file = dir.join("fleet.toml");
    std::fs::write(&file, "[defaults]\nspeedup = 50\n\n[[pods]]\nport = 0\nprofile = \"a10g\"\nmax_loras = 1\n\n[[pods]]\nport = 0\nmetrics_only = true\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let path = file.to_string_lossy().to_string();
    let mut sim = start(&["fleet", &path], 2);
    assert!(sim.pods[1].1.contains("mode=metrics-only"));
    let st = common::http(sim.pods[0].0, "GET", "/admin/state", None)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .json();
    assert_eq!(st["max_loras"], 1);
    assert_eq!(st["profile"], "a10g");
    for (addr, _) in &sim.pods {
        let r = common::http(*addr, "POST", "/admin/fault", Some("{\"mode\":\"die\"}"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status, 200);
    }
    let status =
        wait_exit(&mut sim.child).unwrap_or_else(|| panic!("no exit after every pod died"));
    assert!(status.success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_arguments_fail_with_a_message() {
    let out = Command::new(env!("CARGO_BIN_EXE_model-sim"))
        .args(["--port", "9001", "--profile", "tpu"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown GPU profile"));
}
