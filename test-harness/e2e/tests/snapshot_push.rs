//! The snapshot endpoints in a real Envoy: served only by the filter instance on the internal
//! loopback listener (the public listener answers 404, even with a valid signature); there a
//! push needs the right HMAC of its bytes, every refusal before the signature checks out is the
//! same 403 `forbidden`, bad bytes and old (replayed) generations are refused and change nothing,
//! and the state endpoint tells what is stored. Routing on the public listener uses what the
//! internal one accepted: two filter instances with the same `vm_id` share shared data.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod util;

use serde_json::json;
use testkit::EchoConfig;
use util::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_need_the_internal_listener_a_valid_signature_and_a_newer_snapshot() {
    let a = TestPool::start("llama", "llama-model", 2, EchoConfig::default()).await;
    let envoy = envoy(&[&a], plugin_config(&[&a], json!({}))).await;
    let good = snapshot(vec![(
        &a,
        vec![pod(&a.addr(0), 0, 0.1), pod(&a.addr(1), 5, 0.8)],
    )]);
    let bytes = good.encode().unwrap();
    let (sig_name, sig) = signed(&bytes);
    let internal = envoy.internal_addr.expect("the internal listener");
    let public = envoy.listen_addr;
    assert_ne!(internal, public);

    // The public listener has no snapshot endpoints, signed or not.
    for path in [PUSH, STATE] {
        let r = testkit::post_bytes(public, path, &[(sig_name, &sig)], bytes.clone())
            .await
            .unwrap();
        assert_eq!(r.status, 404, "{path}: {}", r.text());
        let r = testkit::get(public, path, &[]).await.unwrap();
        assert_eq!(r.status, 404, "{path}: {}", r.text());
    }

    // On the internal one: wrong, missing, truncated signatures and the old clear secret are
    // all the same 403.
    let wrong = llm_router_snapshot::sign(b"not-the-secret", &bytes);
    let truncated = sig[..sig.len() - 1].to_string();
    let cases: Vec<Vec<(&str, &str)>> = vec![
        vec![],
        vec![(sig_name, &wrong)],
        vec![(sig_name, &truncated)],
        vec![("x-llm-router-secret", SECRET)],
    ];
    let mut answers = Vec::new();
    for headers in cases {
        let r = testkit::post_bytes(internal, PUSH, &headers, bytes.clone())
            .await
            .unwrap();
        assert_eq!(r.status, 403, "{headers:?}: {}", r.text());
        answers.push(r.text());
    }
    let r = testkit::get(internal, PUSH, &[(sig_name, &sig)])
        .await
        .unwrap();
    assert_eq!(r.status, 403, "GET on the push path");
    answers.push(r.text());
    assert!(
        answers.iter().all(|a| a == &answers[0]),
        "refusals differ: {answers:?}"
    );
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&answers[0]).unwrap()["error"]["message"],
        json!("forbidden")
    );
    assert!(
        state(&envoy).await["generation"].is_null(),
        "a refused push was stored"
    );
    let log = std::fs::read_to_string(&envoy.log_path).unwrap_or_default();
    assert!(
        log.contains("signature does not match"),
        "details belong in the proxy's log:\n{}",
        envoy.log_tail(20)
    );

    // Signed garbage is refused as invalid (only the secret holder can get this far).
    let garbage = b"LRSN\x01\x00\x00\x00\x07".to_vec();
    let (n, v) = signed(&garbage);
    let r = testkit::post_bytes(internal, PUSH, &[(n, &v)], garbage)
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

    // Replaying the accepted push, or an older generation signed right, changes nothing.
    let r = testkit::post_bytes(internal, PUSH, &[(sig_name, &sig)], bytes.clone())
        .await
        .unwrap();
    assert_eq!(r.status, 409, "{}", r.text());
    let mut old = good.clone();
    old.generation -= 1;
    old.pools[0].pods[0].waiting = 50;
    let r = push(&envoy, &old).await;
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(r.json().unwrap()["reason"], json!("stale generation"));
    assert_eq!(
        state(&envoy).await["pools"][0]["pods"][0]["waiting"],
        json!(0)
    );

    // What X-Forwarded-For claims does not matter either way: a signed push on the internal
    // listener claiming a foreign client is accepted.
    let newer = snapshot(vec![(
        &a,
        vec![pod(&a.addr(0), 0, 0.1), pod(&a.addr(1), 5, 0.8)],
    )]);
    let newer_bytes = newer.encode().unwrap();
    let (n, v) = signed(&newer_bytes);
    let r = testkit::post_bytes(
        internal,
        PUSH,
        &[(n, &v), ("x-forwarded-for", "10.1.2.3")],
        newer_bytes,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());

    // The public listener's filter instance routes on what the internal one stored.
    assert_eq!(
        backend(&chat(&envoy, "llama-model", "hi", &[]).await),
        a.addr(0)
    );
}

/// The secret as the manifests give it: not in the plugin configuration but in an environment
/// variable of Envoy (filled from a Kubernetes Secret), passed into the Wasm VM through
/// `vm_config.environment_variables.host_env_keys` and named by `snapshot.secret_env`. A push
/// signed with it is accepted; one signed with another secret (the e2e literal) is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secret_can_come_from_envoys_environment() {
    const VAR: &str = "LLM_ROUTER_SNAPSHOT_SECRET";
    let env_secret = "e2e-secret-from-the-environment-0123456789abcdef";
    let a = TestPool::start("llama", "llama-model", 1, EchoConfig::default()).await;
    let mut cfg = plugin_config(&[&a], json!({}));
    cfg["snapshot"] = json!({"secret_env": VAR});
    let mut spec = testkit::EnvoySpec::new(testkit::Router::Filter)
        .concurrency(2)
        .plugin_config(cfg)
        .pool(a.name, a.cluster, a.addrs());
    spec.wasm_path = Some(testkit::filter_wasm().unwrap_or_else(|e| panic!("{e}")));
    spec.env.insert(VAR.into(), env_secret.into());
    let envoy = spec
        .start()
        .await
        .unwrap_or_else(|e| panic!("envoy did not start: {e}"));
    let internal = envoy.internal_addr.expect("the internal listener");
    let snap = snapshot(vec![(&a, vec![pod(&a.addr(0), 0, 0.1)])]);
    let bytes = snap.encode().unwrap();

    let (name, other) = signed(&bytes);
    let r = testkit::post_bytes(internal, PUSH, &[(name, &other)], bytes.clone())
        .await
        .unwrap();
    assert_eq!(r.status, 403, "signed with another secret: {}", r.text());
    assert!(state(&envoy).await["generation"].is_null());

    let good = llm_router_snapshot::sign(env_secret.as_bytes(), &bytes);
    let r = testkit::post_bytes(internal, PUSH, &[(name, &good)], bytes)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{} / {}", r.text(), envoy.log_tail(20));
    assert_eq!(state(&envoy).await["generation"], json!(snap.generation));
    // And the public listener routes with it.
    let r = chat(&envoy, a.model, "hello", &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(backend(&r), a.addr(0));
}
