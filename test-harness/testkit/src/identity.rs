//! Who a request is: the shipped identity chain `envoy/identity/jwt-authn.yaml` (Envoy's
//! `header_mutation` removing the client's identity headers, then `jwt_authn` writing them from
//! the token's claims) as an [`EnvoySpec::identity`](crate::EnvoySpec::identity) option, so the
//! end-to-end tests run the very filters the project ships in front of the Wasm filter.

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::paths::workspace_root;

/// The shipped fragment.
pub fn jwt_authn_path() -> PathBuf {
    workspace_root().join("envoy/identity/jwt-authn.yaml")
}

/// HTTP filters to put before the Wasm filter, the clusters they use, and what they need of the
/// filter's plugin configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Identity {
    /// In order, before the Wasm filter on the public listener.
    pub http_filters: Vec<Value>,
    /// Added to the bootstrap's clusters.
    pub clusters: Vec<Value>,
    /// Top-level keys merged into the public filter copy's plugin configuration.
    pub plugin_config: Value,
}

impl Identity {
    /// The shipped `envoy/identity/jwt-authn.yaml`, as it is (its JWKS fetched from the issuer
    /// cluster: fine for `envoy --mode validate`, not for a run on loopback).
    pub fn shipped_jwt_authn() -> Result<Identity> {
        let path = jwt_authn_path();
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io("read", &path, e))?;
        let yaml: serde_yaml::Value = serde_yaml::from_str(&text).map_err(|e| Error::Format {
            what: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let doc = serde_json::to_value(yaml).map_err(|e| Error::Format {
            what: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let list = |key: &str| doc[key].as_array().cloned().unwrap_or_default();
        let http_filters = list("http_filters");
        if http_filters.is_empty() {
            return Err(Error::Format {
                what: path.display().to_string(),
                reason: "no http_filters".into(),
            });
        }
        Ok(Identity {
            http_filters,
            clusters: list("clusters"),
            plugin_config: doc["plugin_config"].clone(),
        })
    }

    /// The same chain with every `jwt_authn` provider's keys inline (`local_jwks`, this JWKS
    /// JSON) instead of fetched, and the clusters only the fetch used dropped: nothing leaves the
    /// machine.
    pub fn with_local_jwks(mut self, jwks: &str) -> Identity {
        let mut fetched = Vec::new();
        for f in &mut self.http_filters {
            if f["name"] != "envoy.filters.http.jwt_authn" {
                continue;
            }
            let Some(providers) = f["typed_config"]["providers"].as_object_mut() else {
                continue;
            };
            for p in providers.values_mut() {
                let Some(p) = p.as_object_mut() else {
                    continue;
                };
                if let Some(remote) = p.remove("remote_jwks") {
                    if let Some(c) = remote["http_uri"]["cluster"].as_str() {
                        fetched.push(c.to_string());
                    }
                }
                p.insert("local_jwks".into(), json!({"inline_string": jwks}));
            }
        }
        self.clusters.retain(|c| {
            !fetched
                .iter()
                .any(|n| c["name"].as_str() == Some(n.as_str()))
        });
        self
    }

    /// Merges [`Identity::plugin_config`] into `config` (its top-level keys win).
    pub fn merge_into(&self, config: &mut Value) {
        if let (Some(obj), Some(more)) = (config.as_object_mut(), self.plugin_config.as_object()) {
            for (k, v) in more {
                obj.insert(k.clone(), v.clone());
            }
        }
    }
}
