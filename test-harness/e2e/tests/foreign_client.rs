//! A client on another host cannot reach the snapshot endpoints, whatever it claims. The test
//! makes that other host itself: a network namespace joined to this one by a veth pair
//! (10.250.N.1/30 here, 10.250.N.2/30 there; traffic only between the two ends). Envoy's public
//! listener binds the host end of the veth (only in this test); its internal listener stays on
//! 127.0.0.1. From the namespace, ordinary traffic is served, the push and state paths answer 404
//! on the public listener with and without a spoofed `X-Forwarded-For: 127.0.0.1` (which, with
//! `use_remote_address` at its default `false`, is what Envoy reports as the source address),
//! and the internal listener cannot be connected to at all.
//!
//! Needs root and `ip` (iproute2): skipped with the reason when namespaces cannot be made. The
//! namespace and the veth pair are removed by name when the test ends, also on failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod util;

use serde_json::json;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Output};
use testkit::{EchoConfig, EnvoySpec, Router};
use util::*;

/// Where Debian's iproute2 puts `ip` (and other distributions).
const IP_PATHS: [&str; 3] = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip"];

fn ip_binary() -> Option<&'static str> {
    IP_PATHS
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
}

fn run(args: &[&str]) -> Result<Output, String> {
    let ip = ip_binary().ok_or("ip (iproute2) is not installed")?;
    let out = Command::new(ip)
        .args(args)
        .output()
        .map_err(|e| format!("{ip} {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "{ip} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The namespace and veth pair this test made; removed by name on drop.
struct TestHost {
    netns: String,
    veth_host: String,
    host_ip: Ipv4Addr,
}

impl TestHost {
    fn make() -> Result<TestHost, String> {
        let id = std::process::id() % 10_000;
        let subnet = u8::try_from(std::process::id() % 250).unwrap_or(0);
        let host = TestHost {
            netns: format!("llmr-e2e-{id}"),
            veth_host: format!("llmrh{id}"),
            host_ip: Ipv4Addr::new(10, 250, subnet, 1),
        };
        let peer = format!("llmrn{id}");
        let host_cidr = format!("{}/30", host.host_ip);
        let peer_cidr = format!("10.250.{subnet}.2/30");
        run(&["netns", "add", &host.netns])?;
        // From here on, drop removes whatever was made.
        let steps: [&[&str]; 7] = [
            &[
                "link",
                "add",
                &host.veth_host,
                "type",
                "veth",
                "peer",
                "name",
                &peer,
            ],
            &["link", "set", &peer, "netns", &host.netns],
            &["addr", "add", &host_cidr, "dev", &host.veth_host],
            &["link", "set", &host.veth_host, "up"],
            &["-n", &host.netns, "addr", "add", &peer_cidr, "dev", &peer],
            &["-n", &host.netns, "link", "set", &peer, "up"],
            &["-n", &host.netns, "link", "set", "lo", "up"],
        ];
        for step in steps {
            run(step)?;
        }
        Ok(host)
    }

    /// One HTTP/1.1 request from inside the namespace (bash's /dev/tcp, bounded by `timeout`);
    /// the status code, or `Err` when no connection could be made.
    fn request(
        &self,
        to: SocketAddr,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<u16, String> {
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nhost: {to}\r\nconnection: close\r\ncontent-length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        req.push_str(body);
        let script = format!(
            "exec 3<>/dev/tcp/{}/{} || exit 7; printf '%s' \"$REQ\" >&3; head -c 12 <&3",
            to.ip(),
            to.port()
        );
        let out = Command::new(ip_binary().ok_or("ip is not installed")?)
            .args([
                "netns",
                "exec",
                &self.netns,
                "timeout",
                "10",
                "bash",
                "-c",
                &script,
            ])
            .env("REQ", req)
            .output()
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if !out.status.success() && text.is_empty() {
            return Err(format!(
                "no connection to {to}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        text.split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("no HTTP status from {to}: {text:?}"))
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        // Deleting one end removes the pair; the namespace goes by name.
        let _ = run(&["link", "del", &self.veth_host]);
        let _ = run(&["netns", "del", &self.netns]);
    }
}

/// Why namespaces cannot be made here, if they cannot.
fn cannot_make_namespaces() -> Option<String> {
    if ip_binary().is_none() {
        return Some(format!("ip (iproute2) is in none of {IP_PATHS:?}"));
    }
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    if uid != "0" {
        return Some(format!(
            "not root (uid {uid:?}): network namespaces need root"
        ));
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_on_another_host_cannot_reach_the_snapshot_endpoints() {
    if let Some(why) = cannot_make_namespaces() {
        eprintln!("SKIPPED a_client_on_another_host_cannot_reach_the_snapshot_endpoints: {why}");
        return;
    }
    let host = match TestHost::make() {
        Ok(h) => h,
        Err(e) => {
            eprintln!("SKIPPED a_client_on_another_host_cannot_reach_the_snapshot_endpoints: cannot make the test host: {e}");
            return;
        }
    };
    let a = TestPool::start("llama", "llama-model", 1, EchoConfig::default()).await;
    let mut spec = EnvoySpec::new(Router::Filter)
        .pool(a.name, a.cluster, a.addrs())
        .plugin_config(plugin_config(&[&a], json!({})));
    spec.name = "envoy-foreign-client".into();
    spec.listen_ip = IpAddr::V4(host.host_ip);
    spec.wasm_path = Some(testkit::filter_wasm().unwrap_or_else(|e| panic!("{e}")));
    let envoy = spec
        .start()
        .await
        .unwrap_or_else(|e| panic!("envoy did not start: {e}"));
    let public = SocketAddr::new(IpAddr::V4(host.host_ip), envoy.listen_addr.port());
    let internal = envoy.internal_addr.expect("internal listener");
    assert!(internal.ip().is_loopback());

    let snap = snapshot(vec![(&a, vec![pod(&a.addr(0), 0, 0.1)])]);
    let bytes = snap.encode().unwrap();
    let (sig_name, sig) = signed(&bytes);
    // The snapshot is not valid UTF-8 text for the shell; the refusal happens on the headers,
    // so a text body of the same length is pushed from the namespace.
    let body = "x".repeat(bytes.len());

    // The foreign client reaches the public listener: ordinary traffic is served.
    let chat = json!({"model": "llama-model", "messages": [{"role": "user", "content": "hi"}]})
        .to_string();
    let json_type = [("content-type", "application/json")];
    let status = tokio::task::block_in_place(|| {
        host.request(public, "POST", "/v1/chat/completions", &json_type, &chat)
    });
    assert_eq!(status, Ok(200), "ordinary traffic from the test host");

    // The push and state paths are 404 there, with and without a spoofed X-Forwarded-For.
    for xff in [None, Some("127.0.0.1"), Some("::1")] {
        for (method, path) in [("POST", PUSH), ("GET", STATE)] {
            let mut headers = vec![(sig_name, sig.as_str())];
            if let Some(x) = xff {
                headers.push(("x-forwarded-for", x));
            }
            let status =
                tokio::task::block_in_place(|| host.request(public, method, path, &headers, &body));
            assert_eq!(
                status,
                Ok(404),
                "{method} {path} with X-Forwarded-For {xff:?}"
            );
        }
    }

    // The internal listener is not reachable from the test host: not on the veth address, and
    // the namespace's own loopback is not this host's.
    for to in [
        SocketAddr::new(IpAddr::V4(host.host_ip), internal.port()),
        internal,
    ] {
        let r = tokio::task::block_in_place(|| {
            host.request(to, "POST", PUSH, &[(sig_name, sig.as_str())], &body)
        });
        assert!(
            r.is_err(),
            "the internal listener answered the test host at {to}: {r:?}"
        );
    }
    assert!(
        state(&envoy).await["generation"].is_null(),
        "something from the test host was stored"
    );

    // On this host's loopback the same signed push is accepted, and routes the public side.
    push_ok(&envoy, &snap).await;
    assert_eq!(state(&envoy).await["generation"], json!(snap.generation));
    let status = tokio::task::block_in_place(|| {
        host.request(public, "POST", "/v1/chat/completions", &json_type, &chat)
    });
    assert_eq!(status, Ok(200));
}
