//! The hub channel's keys: one per role, and one tally key per gateway replica.
//!
//! The push secret (`push.secret*`) signs snapshot pushes into the local proxy and nothing else:
//! the proxy holds it (in Envoy's environment), so it must not open the hub. The hub secret
//! (`hub.secret*`), which only the hubs hold, derives ([`llm_router_snapshot::auth::role_key`])
//! - the subscribe key: a gateway sidecar's bearer to open a hub's stream;
//! - the frame key: the hub signs every frame with it, subscribers verify;
//! - the tally master, from which replica `i`'s tally key is derived
//!   ([`llm_router_snapshot::auth::replica_key`]): the hub derives it to verify a tally that says
//!   it comes from `i`, replica `i` is given it, and no replica can derive another's.
//!
//! A gateway sidecar is given a [`Credential`] (`sidecar-metrics credential`): its replica id,
//! the subscribe and frame keys, and its own tally key — never the hub secret. Without one it
//! derives its keys from the hub secret (or, in the configuration from before the roles were
//! split, from the push secret) under a random replica id, and says in its log what that opens.

use llm_router_snapshot::auth::{
    derive_key, from_hex, replica_key, role_key, to_hex, KeyRole, KEY_BYTES,
};

/// A derived key.
pub type Key = [u8; KEY_BYTES];

/// What a hub holds: every key derived from the hub secret.
#[derive(Clone)]
pub struct HubKeys {
    pub subscribe: Key,
    pub frame: Key,
    pub tally_master: Key,
}

impl HubKeys {
    pub fn from_secret(hub_secret: &[u8]) -> HubKeys {
        HubKeys {
            subscribe: role_key(hub_secret, KeyRole::Subscribe),
            frame: role_key(hub_secret, KeyRole::Frame),
            tally_master: role_key(hub_secret, KeyRole::Tally),
        }
    }

    /// Replica `replica`'s credential.
    pub fn credential(&self, replica: u64) -> Credential {
        Credential {
            replica,
            subscribe: self.subscribe,
            frame: self.frame,
            tally: replica_key(&self.tally_master, replica),
        }
    }
}

/// What one gateway replica holds.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    /// Its replica id (never 0), the one its tallies must carry.
    pub replica: u64,
    pub subscribe: Key,
    pub frame: Key,
    /// Its own tally key.
    pub tally: Key,
}

/// First word of a credential file.
const CREDENTIAL_TAG: &str = "llm-router-replica-v1";

impl Credential {
    /// One line: `llm-router-replica-v1 <id> <subscribe hex> <frame hex> <tally hex>`.
    pub fn to_line(&self) -> String {
        format!(
            "{CREDENTIAL_TAG} {} {} {} {}\n",
            self.replica,
            to_hex(&self.subscribe),
            to_hex(&self.frame),
            to_hex(&self.tally)
        )
    }

    /// Reads what [`Credential::to_line`] wrote (surrounding whitespace ignored).
    pub fn parse(text: &str) -> Result<Credential, String> {
        let words: Vec<&str> = text.split_whitespace().collect();
        let [tag, id, s, f, t] = words.as_slice() else {
            return Err(format!(
                "not `{CREDENTIAL_TAG} <id> <subscribe> <frame> <tally>` (made by `sidecar-metrics credential`)"
            ));
        };
        if *tag != CREDENTIAL_TAG {
            return Err(format!("starts with {tag:?}, not {CREDENTIAL_TAG:?}"));
        }
        let replica: u64 = id
            .parse()
            .ok()
            .filter(|&r| r != 0)
            .ok_or_else(|| format!("replica id {id:?} is not a number above 0"))?;
        let key = |what: &str, hex: &str| -> Result<Key, String> {
            from_hex(hex)
                .and_then(|b| Key::try_from(b.as_slice()).ok())
                .ok_or_else(|| format!("the {what} key is not {} hex digits", 2 * KEY_BYTES))
        };
        Ok(Credential {
            replica,
            subscribe: key("subscribe", s)?,
            frame: key("frame", f)?,
            tally: key("tally", t)?,
        })
    }
}

/// A replica id from a name (a pod's name): stable, never 0.
pub fn replica_id_of_name(name: &str) -> u64 {
    let k = derive_key(b"llm-router replica id", name);
    let mut id = [0u8; 8];
    id.copy_from_slice(k.get(..8).unwrap_or(&[1; 8]));
    u64::from_le_bytes(id).max(1)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const HUB: &[u8] = b"hub-secret-0123456789abcdef0123456789";

    #[test]
    fn a_credential_round_trips_and_holds_only_its_own_tally_key() {
        let hub = HubKeys::from_secret(HUB);
        let c = hub.credential(42);
        let back = Credential::parse(&c.to_line()).unwrap();
        assert!(back == c);
        assert!(c.tally != hub.credential(43).tally);
        for k in [c.subscribe, c.frame, c.tally] {
            assert!(k != hub.tally_master);
            assert!(!to_hex(&k).contains(&to_hex(HUB)));
        }
        assert!(Credential::parse("llm-router-replica-v1 0 aa bb cc").is_err());
        assert!(Credential::parse(&c.to_line().replace(" 42 ", " 0 ")).is_err());
        assert!(Credential::parse(&c.to_line().replace("v1", "v2")).is_err());
        assert_eq!(
            replica_id_of_name("llm-gateway-1"),
            replica_id_of_name("llm-gateway-1")
        );
        assert_ne!(
            replica_id_of_name("llm-gateway-1"),
            replica_id_of_name("llm-gateway-2")
        );
    }
}
