//! Parsing whole configurations: defaults, each section's checks and the paths errors name.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use super::*;
use crate::rewrite::Sticky;

fn error_of(json: &str) -> String {
    Config::parse(json.as_bytes()).unwrap_err().to_string()
}

#[test]
fn the_readmes_configuration_reference_parses() {
    let readme = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"));
    let reference = readme
        .split("## Configuration reference")
        .nth(1)
        .and_then(|rest| rest.split("```json\n").nth(1))
        .and_then(|block| block.split("```").next())
        .unwrap_or_default();
    assert!(
        !reference.is_empty(),
        "filter/README.md lost its JSON reference"
    );
    // The reference names the secret's environment variable, as a deployment does.
    let env = |name: &str| {
        (name == "LLM_ROUTER_SNAPSHOT_SECRET").then(|| "reference-secret-0123456789abcdef".into())
    };
    let c = Config::parse_with_env(reference.as_bytes(), &env);
    assert!(c.is_ok(), "filter/README.md's reference: {:?}", c.err());
    let c = c.unwrap();
    assert!(c.flow.enabled);
    assert_eq!(c.rewrites.rules.len(), 1);
    // The sticky draw is keyed by the snapshot secret the environment gave.
    assert_eq!(
        c.rewrites.rules[0].salt,
        crate::rewrite::sticky_salt("reference-secret-0123456789abcdef")
    );
    assert_ne!(c.rewrites.rules[0].salt, 0);
}

#[test]
fn flow_control_is_on_by_default_and_its_admission_bound_is_checked() {
    let c = Config::parse(br#"{"pools":[{"name":"a","models":["x"]}]}"#).unwrap();
    assert!(c.flow.enabled);
    assert!((c.flow.kv_threshold - 0.95).abs() < 1e-9);
    let c = Config::parse(
        br#"{"pools":[{"name":"a","models":["x"]}],"flow":{"enabled":false,"kv_threshold":0.9}}"#,
    )
    .unwrap();
    assert!(!c.flow.enabled);
    assert!((c.flow.kv_threshold - 0.9).abs() < 1e-9);
    for bad in ["0", "1.5", "-0.2"] {
        let e = error_of(&format!(
            r#"{{"pools":[{{"name":"a","models":["x"]}}],"flow":{{"kv_threshold":{bad}}}}}"#
        ));
        assert!(e.contains("flow.kv_threshold"), "{bad}: {e}");
    }
}

#[test]
fn a_typo_inside_a_model_object_names_its_path() {
    let e = error_of(r#"{"pools":[{"name":"a","models":["x",{"name":"m","rewrit":"y"}]}]}"#);
    assert!(
        e.contains("pools[0].models[1].rewrit: unknown field"),
        "{e}"
    );
    let e = error_of(r#"{"pools":[{"name":"a","models":[{"name":"m","adapter":"yes"}]}]}"#);
    assert!(e.contains("pools[0].models[0]: invalid type"), "{e}");
    let e = error_of(r#"{"pools":[{"name":"a","models":[{"rewrite":"m"}]}]}"#);
    assert!(
        e.contains("pools[0].models[0]: missing field `name`"),
        "{e}"
    );
    let e = error_of(r#"{"pools":[{"name":"a","models":[7]}]}"#);
    assert!(
        e.contains("pools[0].models[0]: expected a model name"),
        "{e}"
    );
    let c = Config::parse(
        br#"{"pools":[{"name":"a","models":["x",{"name":"m","rewrite":"y","adapter":true}]}]}"#,
    )
    .unwrap();
    assert_eq!(
        c.models["m"],
        ModelRoute {
            pool: 0,
            rewrite: Some("y".into()),
            adapter: true
        }
    );
    assert_eq!(c.models["x"].rewrite, None);
}

/// 40 bytes, not a placeholder: a secret the policy accepts.
const KEY: &str = "config-test-secret-0123456789abcdef-0123";

#[test]
fn snapshot_endpoints_are_off_by_default_and_need_a_secret() {
    let c = Config::parse(b"{}").unwrap();
    assert!(!c.snapshot.endpoints);
    let c = Config::parse(
        format!(r#"{{"snapshot":{{"endpoints":true,"secret":"{KEY}"}}}}"#).as_bytes(),
    )
    .unwrap();
    assert!(c.snapshot.endpoints);
    assert_eq!(c.snapshot.secret, KEY);
    let e = error_of(r#"{"snapshot":{"endpoints":true}}"#);
    assert!(e.contains("snapshot.secret: must be set"), "{e}");
    let e = error_of(&format!(
        r#"{{"snapshot":{{"secret":"{KEY}","secret_header":"x-s"}}}}"#
    ));
    assert!(e.contains("snapshot.secret_header: no longer used"), "{e}");
}

/// The shipped `change-me` and short keys were accepted; now any configured secret goes
/// through the shared policy, with how to make a good one.
#[test]
fn a_placeholder_or_short_secret_is_a_configuration_error() {
    for bad in ["change-me", "k", "s3cret-for-tests"] {
        let e = error_of(&format!(
            r#"{{"snapshot":{{"endpoints":true,"secret":"{bad}"}}}}"#
        ));
        assert!(
            e.contains("snapshot.secret:") && e.contains("openssl rand"),
            "{bad}: {e}"
        );
    }
    // Also where endpoints are off (the public listener's copy of the section).
    let e = error_of(r#"{"snapshot":{"secret":"change-me"}}"#);
    assert!(e.contains("placeholder"), "{e}");
}

#[test]
fn the_secret_can_come_from_an_environment_variable() {
    let env = |name: &str| match name {
        "LLM_ROUTER_SNAPSHOT_SECRET" => Some(KEY.to_string()),
        "FROM_FILE" => Some(format!("{KEY}\r\n")),
        "SHORT" => Some("abc".to_string()),
        "EMPTY" => Some(String::new()),
        _ => None,
    };
    let parse = |json: &str| Config::parse_with_env(json.as_bytes(), &env);
    let c = parse(r#"{"snapshot":{"endpoints":true,"secret_env":"LLM_ROUTER_SNAPSHOT_SECRET"}}"#)
        .unwrap();
    assert_eq!(c.snapshot.secret, KEY);
    // As the sidecar reads a secret file: the trailing line end is not part of the key.
    let c = parse(r#"{"snapshot":{"endpoints":true,"secret_env":"FROM_FILE"}}"#).unwrap();
    assert_eq!(c.snapshot.secret, KEY);
    for (var, needle) in [
        ("UNSET", "environment variable UNSET is not set or empty"),
        ("EMPTY", "environment variable EMPTY is not set or empty"),
        (
            "SHORT",
            "environment variable SHORT: the snapshot secret is 3 bytes",
        ),
    ] {
        let e = parse(&format!(
            r#"{{"snapshot":{{"endpoints":true,"secret_env":"{var}"}}}}"#
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("snapshot.secret_env:") && e.contains(needle),
            "{e}"
        );
    }
    for bad in ["", "A=B", "has space", "X\\u0000"] {
        let e = parse(&format!(r#"{{"snapshot":{{"secret_env":"{bad}"}}}}"#))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("must name an environment variable"),
            "{bad}: {e}"
        );
    }
    let e = parse(&format!(
        r#"{{"snapshot":{{"secret":"{KEY}","secret_env":"LLM_ROUTER_SNAPSHOT_SECRET"}}}}"#
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("not both"), "{e}");
}

#[test]
fn unknown_paths_pass_by_default_and_reject_when_asked() {
    assert_eq!(
        Config::parse(b"{}").unwrap().unknown_paths,
        UnknownPaths::Pass
    );
    let c = Config::parse(br#"{"unknown_paths":"reject"}"#).unwrap();
    assert_eq!(c.unknown_paths, UnknownPaths::Reject);
    let c = Config::parse(br#"{"unknown_paths":"pass"}"#).unwrap();
    assert_eq!(c.unknown_paths, UnknownPaths::Pass);
    let e = error_of(r#"{"unknown_paths":"drop"}"#);
    assert!(
        e.contains("unknown_paths: \"drop\" is not one of pass, reject"),
        "{e}"
    );
}

#[test]
fn nothing_about_the_fleet_is_disclosed_by_default() {
    let c = Config::parse(b"{}").unwrap();
    assert_eq!(c.disclose, Disclose::default());
    assert!(!c.disclose.served_pod && !c.disclose.pool_detail);
    let c = Config::parse(br#"{"disclose":{"served_pod":true}}"#).unwrap();
    assert!(c.disclose.served_pod && !c.disclose.pool_detail);
    let c = Config::parse(br#"{"disclose":{"pool_detail":true}}"#).unwrap();
    assert!(!c.disclose.served_pod && c.disclose.pool_detail);
    let e = error_of(r#"{"disclose":{"served":true}}"#);
    assert!(e.contains("unknown field `served`"), "{e}");
}

#[test]
fn client_priority_is_not_trusted_by_default() {
    assert!(!Config::parse(b"{}").unwrap().priority.trust_headers);
    let c = Config::parse(br#"{"priority":{"trust_headers":true}}"#).unwrap();
    assert!(c.priority.trust_headers);
    let c = Config::parse(br#"{"objectives":{"batch":-1,"vip":1}}"#).unwrap();
    assert_eq!(c.request_priority(Some("1"), Some("vip")), 0);
    assert_eq!(c.request_priority(Some("-1"), Some("batch")), 0);
    let c =
        Config::parse(br#"{"objectives":{"batch":-1,"vip":1},"priority":{"trust_headers":true}}"#)
            .unwrap();
    assert_eq!(c.request_priority(Some("2"), Some("batch")), 2);
    assert_eq!(c.request_priority(None, Some("batch")), -1);
    assert_eq!(c.request_priority(None, Some("unlisted")), 0);
    assert_eq!(c.request_priority(Some("x"), Some("vip")), 1);
    let e = error_of(r#"{"priority":{"trust":true}}"#);
    assert!(e.contains("unknown field `trust`"), "{e}");
}

#[test]
fn rewrite_rules_need_weights_above_zero_and_targets_that_exist() {
    let pools = r#""pools":[{"name":"a","models":["llama-v1",{"name":"llama-v2","adapter":true}]},{"name":"b"}]"#;
    let parse = |rules: &str| Config::parse(format!("{{{pools},\"rewrites\":{rules}}}").as_bytes());
    let c = parse(
        r#"[{"model":"llama","sticky":"conversation","targets":[
                {"model":"llama-v1","weight":90},{"model":"llama-v2","weight":10},
                {"model":"other","pool":"b","weight":0}]}]"#,
    )
    .unwrap();
    let rule = c.rewrites.rule("llama").unwrap();
    assert_eq!(rule.sticky, Sticky::Conversation);
    let t: Vec<(&str, usize, bool, u32)> = rule
        .targets
        .iter()
        .map(|t| (t.model.as_str(), t.pool, t.adapter, t.weight))
        .collect();
    assert_eq!(
        t,
        [
            ("llama-v1", 0, false, 90),
            ("llama-v2", 0, true, 10),
            ("other", 1, false, 0)
        ]
    );
    assert!(c.rewrites.rule("llama-v1").is_none());
    assert_eq!(c.served_model_header, "x-llm-router-served-model");
    // A single target's weight defaults to 1.
    let c = parse(r#"[{"model":"alias","targets":[{"model":"llama-v1"}]}]"#).unwrap();
    assert_eq!(c.rewrites.rules[0].targets[0].weight, 1);
    for (rules, needle) in [
        (
            r#"[{"model":"llama","targets":[{"model":"llama-v1","weight":0}]}]"#,
            "rewrites[0].targets: the weights sum to 0",
        ),
        (
            r#"[{"model":"llama","targets":[]}]"#,
            "rewrites[0].targets: at least one target",
        ),
        (
            r#"[{"model":"llama","targets":[{"model":"llama-v3","weight":5}]}]"#,
            "rewrites[0].targets[0].model: \"llama-v3\" is not a configured model name",
        ),
        (
            r#"[{"model":"llama","targets":[{"model":"x","pool":"c"}]}]"#,
            "rewrites[0].targets[0].pool: \"c\" is not a configured pool",
        ),
        (
            r#"[{"model":"llama","targets":[{"model":"llama-v1","weight":1000001}]}]"#,
            "rewrites[0].targets[0].weight: 1000001 must be in 0..=1000000",
        ),
        (
            r#"[{"model":"llama","sticky":"session","targets":[{"model":"llama-v1"}]}]"#,
            "rewrites[0].sticky: \"session\" is not one of none, conversation",
        ),
        (
            r#"[{"model":"m","targets":[{"model":"llama-v1"}]},{"model":"m","targets":[{"model":"llama-v1"}]}]"#,
            "rewrites[1].model: \"m\" already has a rule",
        ),
        (
            r#"[{"model":"m","targets":[{"model":"llama-v1","wieght":3}]}]"#,
            "unknown field `wieght`",
        ),
    ] {
        let e = parse(rules).unwrap_err().to_string();
        assert!(e.contains(needle), "{rules}: {e}");
    }
}

/// From the `config` fuzz target (a crash of its round-trip property, which now builds
/// serde_json with `float_roundtrip`): a weight written with more digits than an f64 holds
/// is accepted, parsed to within an ULP or so (serde_json's default, best-effort precision).
#[test]
fn a_weight_with_more_digits_than_a_double_holds_is_accepted() {
    let c = Config::parse(
        br#"{"pools":[{"name":"p","cluster":"c","models":["m"],
                 "weights":{"affinity":1111.11151111111111111111111111510}}]}"#,
    )
    .unwrap();
    let affinity = c.pools[0].weights.0[6];
    assert!(
        (affinity / 1_111.111_511_111_111_2 - 1.0).abs() < 1e-14,
        "{affinity}"
    );
}

/// Weights near `f64::MAX` would each pass a finiteness check and still sum to infinity,
/// turning every score into NaN: weights are bounded.
#[test]
fn weights_are_bounded_so_their_sum_stays_finite() {
    let e = error_of(
        r#"{"pools":[{"name":"p","cluster":"c","models":["m"],
                 "weights":{"ttft":1e308,"queue":1e308}}]}"#,
    );
    assert!(e.contains("weights.") && e.contains("0..=1000000"), "{e}");
    let ok = Config::parse(
        br#"{"pools":[{"name":"p","cluster":"c","models":["m"],
                 "weights":{"ttft":1000000,"queue":1000000}}]}"#,
    );
    assert!(ok.is_ok());
}
