//! Who a request is, in a real Envoy: the shipped identity chain (`envoy/identity/jwt-authn.yaml`:
//! header_mutation, then jwt_authn with `claim_to_headers`) in front of the filter, with an ES256
//! key pair and a JWKS this test makes (inline: nothing reaches the network). The token's
//! objective decides the request's band at saturation; the client's own identity headers are
//! gone before jwt_authn writes them; no or a bad token is jwt_authn's 401; the token's tenant
//! reaches the pod as `x-llm-d-inference-fairness-id`, the token itself does not.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod util;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use serde_json::{json, Value};
use std::time::{SystemTime, UNIX_EPOCH};
use testkit::{EchoConfig, EnvoyProcess, EnvoySpec, HttpResponse, Identity, Router};
use util::*;

const ISSUER: &str = "https://issuer.example.com";
const AUDIENCE: &str = "llm-gateway";
const KID: &str = "e2e-key-1";
const FAIRNESS: &str = "x-llm-d-inference-fairness-id";
const OBJECTIVE: &str = "x-llm-d-inference-objective";

/// A token issuer: one P-256 key pair, its JWKS, and ES256-signed JWTs.
struct Issuer {
    key: EcdsaKeyPair,
    rng: SystemRandom,
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

impl Issuer {
    fn new() -> Issuer {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        Issuer { key, rng }
    }

    /// The public key as a JWKS (uncompressed point: 0x04, x, y).
    fn jwks(&self) -> String {
        let point = self.key.public_key().as_ref();
        assert_eq!(point.len(), 65);
        json!({"keys": [{
            "kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": KID,
            "x": b64(&point[1..33]), "y": b64(&point[33..65]),
        }]})
        .to_string()
    }

    fn sign(&self, claims: &Value) -> String {
        let header = json!({"alg": "ES256", "typ": "JWT", "kid": KID});
        let input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let sig = self.key.sign(&self.rng, input.as_bytes()).unwrap();
        format!("{input}.{}", b64(sig.as_ref()))
    }

    /// A valid token for `tenant` with this objective claim (none when `None`).
    fn token(&self, tenant: &str, objective: Option<&str>) -> String {
        let mut claims = json!({
            "iss": ISSUER, "aud": AUDIENCE, "sub": tenant, "tenant": tenant,
            "iat": now_s(), "exp": now_s() + 3600,
        });
        if let Some(o) = objective {
            claims["objective"] = json!(o);
        }
        self.sign(&claims)
    }
}

async fn gateway(pool: &TestPool, identity: Identity) -> EnvoyProcess {
    let mut spec = EnvoySpec::new(Router::Filter)
        .concurrency(2)
        // Placed or shed at once: what a token is worth is tested here, holding in flow.rs.
        .plugin_config(plugin_config(&[pool], json!({"flow": {"enabled": false}})))
        .identity(identity)
        .pool(pool.name, pool.cluster, pool.addrs());
    spec.wasm_path = Some(testkit::filter_wasm().unwrap_or_else(|e| panic!("{e}")));
    spec.start()
        .await
        .unwrap_or_else(|e| panic!("envoy did not start: {e}"))
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

async fn ask(envoy: &EnvoyProcess, model: &str, headers: &[(&str, &str)]) -> HttpResponse {
    chat(envoy, model, "who am I?", headers).await
}

fn assert_shed(r: &HttpResponse, what: &str) {
    assert_eq!(r.status, 429, "{what}: {}", r.text());
    assert_eq!(
        r.header("x-llm-router-dropped-reason"),
        Some("rejected-saturated"),
        "{what}"
    );
}

/// Every value of a header as the pod received it.
fn received(pool: &TestPool, name: &str) -> Vec<Vec<String>> {
    pool.pods
        .iter()
        .flat_map(|p| p.requests())
        .map(|r| {
            r.headers
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
                .collect()
        })
        .collect()
}

fn pod_requests(pool: &TestPool) -> u64 {
    pool.pods.iter().map(|p| p.request_count()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_decides_the_band_forged_headers_are_ignored_and_no_token_is_401() {
    let a = TestPool::start("llama", "llama-model", 2, EchoConfig::default()).await;
    let issuer = Issuer::new();
    let identity = Identity::shipped_jwt_authn()
        .unwrap()
        .with_local_jwks(&issuer.jwks());
    let envoy = gateway(&a, identity).await;
    let model = "llama-model";

    // No token, a token from another key, a malformed one, an expired one: jwt_authn's 401;
    // a good token meant for another audience: its 403 (as Envoy 1.40 answers). Nothing
    // reaches a pod.
    let stranger = Issuer::new();
    let expired = issuer.sign(&json!({
        "iss": ISSUER, "aud": AUDIENCE, "tenant": "t", "objective": "premium",
        "iat": now_s() - 7200, "exp": now_s() - 3600,
    }));
    let elsewhere = issuer.sign(&json!({
        "iss": ISSUER, "aud": "another-service", "tenant": "t", "exp": now_s() + 3600,
    }));
    let other_key = stranger.token("tenant-a", Some("premium"));
    for (what, auth, status) in [
        ("no token", None, 401),
        ("another key", Some(bearer(&other_key)), 401),
        ("malformed", Some(bearer("not.a.jwt")), 401),
        ("expired", Some(bearer(&expired)), 401),
        ("wrong audience", Some(bearer(&elsewhere)), 403),
    ] {
        let headers: Vec<(&str, &str)> = auth
            .as_deref()
            .map(|v| vec![("authorization", v), (OBJECTIVE, "premium")])
            .unwrap_or_else(|| vec![(OBJECTIVE, "premium")]);
        let r = ask(&envoy, model, &headers).await;
        assert_eq!(r.status, status, "{what}: {}", r.text());
        assert_eq!(
            r.header("x-llm-router-dropped-reason"),
            None,
            "{what}: answered by jwt_authn, before the filter"
        );
    }
    assert_eq!(pod_requests(&a), 0);

    // A valid token: served, the tenant reaches the pod as the fairness id, once, and the
    // client's own copy and the token do not.
    let standard = issuer.token("tenant-a", Some("interactive"));
    let r = ask(
        &envoy,
        model,
        &[
            ("authorization", &bearer(&standard)),
            (FAIRNESS, "someone-else"),
            ("x-gateway-inference-fairness-id", "someone-else"),
        ],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(received(&a, FAIRNESS), vec![vec!["tenant-a".to_string()]]);
    assert_eq!(
        received(&a, OBJECTIVE),
        vec![vec!["interactive".to_string()]]
    );
    assert_eq!(
        received(&a, "x-gateway-inference-fairness-id"),
        vec![Vec::<String>::new()]
    );
    assert_eq!(received(&a, "authorization"), vec![Vec::<String>::new()]);

    // Saturated (every pod past the queue and KV bounds): the token's sheddable objective is
    // refused, a standard one is served.
    push_ok(
        &envoy,
        &snapshot(vec![(
            &a,
            vec![pod(&a.addr(0), 7, 0.85), pod(&a.addr(1), 6, 0.9)],
        )]),
    )
    .await;
    let batch = issuer.token("tenant-b", Some("batch"));
    let r = ask(&envoy, model, &[("authorization", &bearer(&batch))]).await;
    assert_shed(&r, "a sheddable token");
    // Forged critical headers beside the sheddable token change nothing: removed before
    // jwt_authn wrote the token's objective.
    let batch_auth = bearer(&batch);
    let forged = [
        ("authorization", batch_auth.as_str()),
        (OBJECTIVE, "premium"),
        ("x-gateway-inference-objective", "premium"),
        ("x-llm-router-priority", "5"),
    ];
    let r = ask(&envoy, model, &forged).await;
    assert_shed(&r, "a sheddable token with forged critical headers");
    let r = ask(&envoy, model, &[("authorization", &bearer(&standard))]).await;
    assert_eq!(r.status, 200, "a standard token: {}", r.text());
    // A token without an objective is standard, whatever the client claims.
    let plain = issuer.token("tenant-c", None);
    let r = ask(
        &envoy,
        model,
        &[("authorization", &bearer(&plain)), (OBJECTIVE, "batch")],
    )
    .await;
    assert_eq!(r.status, 200, "a token without objective: {}", r.text());

    // Far past saturation standard requests go too; the token's critical objective is served,
    // a standard token with forged critical headers is not.
    push_ok(
        &envoy,
        &snapshot(vec![(
            &a,
            vec![pod(&a.addr(0), 80, 0.99), pod(&a.addr(1), 90, 0.99)],
        )]),
    )
    .await;
    let premium = issuer.token("tenant-d", Some("premium"));
    let r = ask(&envoy, model, &[("authorization", &bearer(&premium))]).await;
    assert_eq!(r.status, 200, "a critical token: {}", r.text());
    let r = ask(
        &envoy,
        model,
        &[
            ("authorization", &bearer(&standard)),
            (OBJECTIVE, "premium"),
            ("x-llm-router-priority", "5"),
        ],
    )
    .await;
    assert_shed(&r, "a standard token with forged critical headers");
}
