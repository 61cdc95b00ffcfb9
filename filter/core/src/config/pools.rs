//! The `pools` section: each pool's name, cluster and tuning, and the model names (and LoRA
//! adapters) it serves, each name in one pool only.

use std::collections::HashMap;

use super::check::err;
use super::raw::{raw_model, RawModel, RawPool, RawPoolTuning};
use super::resolved::{ModelRoute, PoolConfig};
use super::tuning::tuning;
use super::ConfigError;

/// The configured pools, each tuned from `default_pool`, and the routes of the model names
/// they list.
pub(super) fn pools(
    raw: &[RawPool],
    default_pool: &PoolConfig,
) -> Result<(Vec<PoolConfig>, HashMap<String, ModelRoute>), ConfigError> {
    let mut pools = Vec::with_capacity(raw.len());
    let mut models: HashMap<String, ModelRoute> = HashMap::new();
    for (i, p) in raw.iter().enumerate() {
        let path = format!("pools[{i}]");
        let pool = pool(&path, p, &pools, default_pool)?;
        routes(i, &path, p, raw, &mut models)?;
        pools.push(pool);
    }
    Ok((pools, models))
}

/// The pool `p` at `path`, whose name none of the pools before it (`earlier`) has.
fn pool(
    path: &str,
    p: &RawPool,
    earlier: &[PoolConfig],
    default_pool: &PoolConfig,
) -> Result<PoolConfig, ConfigError> {
    if p.name.is_empty() {
        return err(format!("{path}.name: must not be empty"));
    }
    if earlier.iter().any(|q| q.name == p.name) {
        return err(format!("{path}.name: pool {:?} is defined twice", p.name));
    }
    let cluster = p.cluster.clone().unwrap_or_else(|| p.name.clone());
    if cluster.is_empty() {
        return err(format!("{path}.cluster: must not be empty"));
    }
    let t = RawPoolTuning {
        preset: p.preset.clone(),
        weights: p.weights.clone(),
        saturation: p.saturation,
        prefix: p.prefix,
        predict: p.predict,
        lora: p.lora,
    };
    let mut pool = tuning(path, default_pool, &t)?;
    pool.name = p.name.clone();
    pool.cluster = cluster;
    Ok(pool)
}

/// Adds the routes of the `models` and `adapters` of `p`, pool `i` of `raw` (at `path`), to
/// `models`.
fn routes(
    i: usize,
    path: &str,
    p: &RawPool,
    raw: &[RawPool],
    models: &mut HashMap<String, ModelRoute>,
) -> Result<(), ConfigError> {
    for (j, m) in p.models.iter().enumerate() {
        let at = format!("{path}.models[{j}]");
        let m = raw_model(&at, m)?;
        let (name, rewrite, adapter) = match &m {
            RawModel::Name(n) => (n.as_str(), None, false),
            RawModel::Full(f) => (f.name.as_str(), f.rewrite.clone(), f.adapter),
        };
        if rewrite.as_deref() == Some("") {
            return err(format!("{at}.rewrite: must not be empty"));
        }
        let route = ModelRoute {
            pool: i,
            rewrite,
            adapter,
        };
        add_route(models, raw, name, route, &at)?;
    }
    for (j, a) in p.adapters.iter().enumerate() {
        let route = ModelRoute {
            pool: i,
            rewrite: None,
            adapter: true,
        };
        add_route(models, raw, a, route, &format!("{path}.adapters[{j}]"))?;
    }
    Ok(())
}

/// Routes the model name `name` (listed at `at`) unless it is empty or another pool of `raw`
/// has it already.
fn add_route(
    models: &mut HashMap<String, ModelRoute>,
    raw: &[RawPool],
    name: &str,
    route: ModelRoute,
    at: &str,
) -> Result<(), ConfigError> {
    if name.is_empty() {
        return err(format!("{at}: model name must not be empty"));
    }
    if let Some(prev) = models.get(name) {
        let other = raw.get(prev.pool).map(|q| q.name.as_str()).unwrap_or("?");
        return err(format!(
            "{at}: model {name:?} is already mapped to pool {other:?}"
        ));
    }
    models.insert(name.to_string(), route);
    Ok(())
}
