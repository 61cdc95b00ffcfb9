//! DNS discovery against a real resolver: dnsmasq on a loopback port, serving a hosts file the
//! test rewrites (SIGHUP makes dnsmasq reread it). Pods that appear or vanish in DNS show up in
//! the next snapshot. Needs `dnsmasq` (installed by `./build.sh setup`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::{SocketAddr, TcpListener as StdTcp, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use sidecar_metrics::config::{Discovery, DnsConfig};
use sidecar_metrics::discovery::{dns_resolver, resolve_once};
use sidecar_metrics::sidecar;

const LIMIT: Duration = Duration::from_secs(15);

/// A dnsmasq child answering for `*.test` from a hosts file; killed on drop.
struct Dnsmasq {
    child: Child,
    port: u16,
    hosts: PathBuf,
    _dir: TempDir,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn free_udp_tcp_port() -> u16 {
    for _ in 0..50 {
        let u = UdpSocket::bind("127.0.0.1:0").expect("udp bind");
        let port = u.local_addr().expect("addr").port();
        if StdTcp::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port");
}

fn dnsmasq_bin() -> PathBuf {
    for p in ["/usr/sbin/dnsmasq", "/usr/bin/dnsmasq", "/sbin/dnsmasq"] {
        if std::path::Path::new(p).exists() {
            return p.into();
        }
    }
    panic!("dnsmasq not found: install it with `./build.sh setup` (apt-get install -y dnsmasq)");
}

impl Dnsmasq {
    fn start(hosts_text: &str) -> Dnsmasq {
        let dir = std::env::temp_dir().join(format!(
            "sidecar-dns-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let hosts = dir.join("hosts");
        std::fs::write(&hosts, hosts_text).expect("write hosts");
        let port = free_udp_tcp_port();
        let child = Command::new(dnsmasq_bin())
            .args([
                "--no-daemon",
                "--conf-file=/dev/null",
                "--pid-file=",
                "--port",
                &port.to_string(),
                "--listen-address=127.0.0.1",
                "--bind-interfaces",
                "--no-resolv",
                "--no-hosts",
                "--local=/test/",
                "--local-ttl=0",
                "--cache-size=0",
            ])
            .arg(format!("--addn-hosts={}", hosts.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start dnsmasq");
        Dnsmasq {
            child,
            port,
            hosts,
            _dir: TempDir(dir),
        }
    }

    fn nameserver(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Rewrites the hosts file and makes dnsmasq reread it.
    fn set_hosts(&self, text: &str) {
        std::fs::write(&self.hosts, text).expect("write hosts");
        let ok = Command::new("kill")
            .arg("-HUP")
            .arg(self.child.id().to_string())
            .status()
            .expect("kill -HUP");
        assert!(ok.success());
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn dns_cfg(name: &str, port: u16, ns: String) -> DnsConfig {
    DnsConfig {
        name: name.into(),
        port,
        interval_ms: 50,
        nameserver: Some(ns),
    }
}

/// Waits until dnsmasq answers `name` with `want` addresses.
async fn wait_resolves(d: &Dnsmasq, name: &str, port: u16, want: &[SocketAddr]) {
    let r = dns_resolver(&dns_cfg(name, port, d.nameserver())).expect("resolver");
    let start = Instant::now();
    loop {
        let got = resolve_once(&r, name, port).await;
        if got.as_deref() == Ok(want) {
            return;
        }
        assert!(
            start.elapsed() < LIMIT,
            "dnsmasq never answered {want:?} for {name}: last {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn resolver_reads_a_records_and_empty_answers() {
    let d = Dnsmasq::start("127.0.0.2 a.test\n127.0.0.3 a.test\n");
    let want: Vec<SocketAddr> = vec![
        "127.0.0.2:8000".parse().expect("sa"),
        "127.0.0.3:8000".parse().expect("sa"),
    ];
    wait_resolves(&d, "a.test", 8000, &want).await;
    // A name dnsmasq is authoritative for but does not know: an empty set, not an error.
    let r = dns_resolver(&dns_cfg("missing.test", 1, d.nameserver())).expect("resolver");
    assert_eq!(resolve_once(&r, "missing.test", 1).await, Ok(vec![]));
}

/// Two fake pods on the same port at 127.0.0.2 and 127.0.0.3 (DNS gives IPs, the port is shared).
async fn two_pods_same_port() -> (Vec<tokio::task::JoinHandle<()>>, u16) {
    for _ in 0..50 {
        let a = tokio::net::TcpListener::bind("127.0.0.2:0")
            .await
            .expect("bind");
        let port = a.local_addr().expect("addr").port();
        let Ok(b) = tokio::net::TcpListener::bind(("127.0.0.3", port)).await else {
            continue;
        };
        let mut tasks = Vec::new();
        for l in [a, b] {
            let app = axum::Router::new().route(
                "/metrics",
                axum::routing::get(|| async { vllm_text(2, 1, 0.5) }),
            );
            tasks.push(tokio::spawn(async move {
                let _ = axum::serve(l, app).await;
            }));
        }
        return (tasks, port);
    }
    panic!("no common free port on 127.0.0.2/3");
}

#[tokio::test]
async fn pods_appearing_and_vanishing_in_dns_reach_the_snapshot() {
    let (tasks, port) = two_pods_same_port().await;
    let d = Dnsmasq::start("127.0.0.2 llama.test\n");
    let a: SocketAddr = format!("127.0.0.2:{port}").parse().expect("sa");
    let b: SocketAddr = format!("127.0.0.3:{port}").parse().expect("sa");
    wait_resolves(&d, "llama.test", port, &[a]).await;

    let proxy = FakeProxy::start().await;
    let cfg = config(
        proxy.addr,
        Discovery::Dns(dns_cfg("llama.test", port, d.nameserver())),
        20,
        1000,
    );
    let running = sidecar::start(cfg, common::SECRET.into())
        .await
        .expect("start");
    let has = |want: Vec<String>| {
        move |s: &[llm_router_snapshot::Snapshot]| s.last().is_some_and(|s| pod_addrs(s) == want)
    };
    let snaps = proxy
        .wait_for("pod a", LIMIT, has(vec![a.to_string()]))
        .await;
    let last = snaps.last().and_then(|s| s.pool("llama")).expect("pool");
    // The pod behind the DNS name is scraped like any other.
    proxy
        .wait_for("pod a scraped", LIMIT, |s| {
            s.last()
                .and_then(|s| s.pool("llama"))
                .is_some_and(|p| p.pods.iter().all(|p| p.waiting == 2 && p.running == 1))
        })
        .await;
    assert_eq!(last.cluster, "pool_llama");

    d.set_hosts("127.0.0.2 llama.test\n127.0.0.3 llama.test\n");
    proxy
        .wait_for(
            "pods a and b",
            LIMIT,
            has(vec![a.to_string(), b.to_string()]),
        )
        .await;
    d.set_hosts("127.0.0.3 llama.test\n");
    proxy
        .wait_for("pod b only", LIMIT, has(vec![b.to_string()]))
        .await;
    d.set_hosts("");
    proxy.wait_for("no pods", LIMIT, has(vec![])).await;
    running.stop().await;
    for t in tasks {
        t.abort();
    }
}
