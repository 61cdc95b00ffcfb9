//! The snapshot endpoint in a real Envoy: the right secret is required, bad bytes and old
//! generations are refused and change nothing, the state endpoint tells what is stored.
//! (A non-loopback source cannot be produced on this machine's loopback-only network; the
//! wasmtime host tests that refusal by setting `source.address`.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod util;

use serde_json::json;
use testkit::EchoConfig;
use util::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_need_the_secret_and_a_valid_newer_snapshot() {
    let a = TestPool::start("llama", "llama-model", 2, EchoConfig::default()).await;
    let envoy = envoy(&[&a], plugin_config(&[&a], json!({}))).await;
    let good = snapshot(vec![(
        &a,
        vec![pod(&a.addr(0), 0, 0.1), pod(&a.addr(1), 5, 0.8)],
    )]);
    let bytes = good.encode().unwrap();
    let addr = envoy.listen_addr;

    for headers in [vec![], vec![("x-llm-router-secret", "wrong")]] {
        let r = testkit::post_bytes(addr, PUSH, &headers, bytes.clone())
            .await
            .unwrap();
        assert_eq!(r.status, 403, "{}", r.text());
        assert_eq!(r.json().unwrap()["accepted"], json!(false));
    }
    let r = testkit::get(addr, STATE, &[("x-llm-router-secret", "wrong")])
        .await
        .unwrap();
    assert_eq!(r.status, 403);
    assert!(
        state(&envoy).await["generation"].is_null(),
        "a refused push was stored"
    );

    let r = testkit::post_bytes(
        addr,
        PUSH,
        &[("x-llm-router-secret", SECRET)],
        b"LRSN\x01\x00\x00\x00\x07".to_vec(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 400);
    assert!(r.json().unwrap()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("truncated"));

    push_ok(&envoy, &good).await;
    let s = state(&envoy).await;
    assert_eq!(s["generation"], json!(good.generation));
    assert_eq!(s["pools"][0]["pods"][1]["waiting"], json!(5));

    let mut old = good.clone();
    old.pools[0].pods[0].waiting = 50;
    let r = push(&envoy, &old).await;
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(r.json().unwrap()["reason"], json!("stale generation"));
    assert_eq!(
        state(&envoy).await["pools"][0]["pods"][0]["waiting"],
        json!(0)
    );

    // A GET on the push path is refused; the routing of ordinary traffic is unaffected.
    let r = testkit::get(addr, PUSH, &[("x-llm-router-secret", SECRET)])
        .await
        .unwrap();
    assert_eq!(r.status, 405);
    assert_eq!(
        backend(&chat(&envoy, "llama-model", "hi", &[]).await),
        a.addr(0)
    );
}
