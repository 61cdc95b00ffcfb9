//! GPU profiles: the one place where the emulator's hardware defaults live.
//!
//! Every number here is explained, with its public source, in `CALIBRATION.md` beside
//! `Cargo.toml`. Change a default there and here together.

use std::fmt;

/// Speed and memory of one emulated GPU serving an 8B-class model (Llama-3.1-8B, bf16).
///
/// Step time of one engine iteration (see `engine.rs`):
/// `step_base_s + decode_seqs * decode_per_seq_s + prefill_tokens * prefill_per_token_s
///  + context_tokens * kv_read_per_token_s + adapter_loads * lora_load_s`.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Profile name as given on the command line (`h100`, `a10g`).
    pub name: String,
    /// Tokens per KV block (vLLM `--block-size`).
    pub block_size: u32,
    /// KV blocks that fit in GPU memory (vLLM `num_gpu_blocks`).
    pub num_gpu_blocks: u32,
    /// Most sequences in the running batch (vLLM `--max-num-seqs`).
    pub max_num_seqs: u32,
    /// Token budget of one step, prefill chunks plus decodes (vLLM `--max-num-batched-tokens`).
    pub max_num_batched_tokens: u32,
    /// Longest prompt + output accepted (vLLM `--max-model-len`).
    pub max_model_len: u32,
    /// Fixed cost of one step: reading the weights once plus launch overhead (seconds).
    pub step_base_s: f64,
    /// Extra cost per decoding sequence in the batch (seconds).
    pub decode_per_seq_s: f64,
    /// Cost per prefill token (seconds).
    pub prefill_per_token_s: f64,
    /// Cost per token of KV context read by the batch's attention (seconds).
    pub kv_read_per_token_s: f64,
    /// Time to load one LoRA adapter into a GPU slot (seconds).
    pub lora_load_s: f64,
}

/// Names accepted by [`Profile::by_name`].
pub const PROFILE_NAMES: &[&str] = &["h100", "a10g"];

/// Error for an unknown profile name.
#[derive(Debug, thiserror::Error)]
#[error("unknown GPU profile {name:?} (known: h100, a10g)")]
pub struct UnknownProfile {
    /// The name that was asked for.
    pub name: String,
}

impl Profile {
    /// NVIDIA H100 SXM 80 GB serving Llama-3.1-8B-Instruct in bf16 with vLLM defaults.
    pub fn h100() -> Self {
        Profile {
            name: "h100".into(),
            block_size: 16,
            num_gpu_blocks: 28_000,
            max_num_seqs: 1024,
            max_num_batched_tokens: 8192,
            max_model_len: 131_072,
            step_base_s: 0.0065,
            decode_per_seq_s: 0.000_040,
            prefill_per_token_s: 0.000_040,
            kv_read_per_token_s: 0.000_000_045,
            lora_load_s: 0.100,
        }
    }

    /// NVIDIA A10G 24 GB serving the same model in bf16 with vLLM defaults.
    pub fn a10g() -> Self {
        Profile {
            name: "a10g".into(),
            block_size: 16,
            num_gpu_blocks: 2_250,
            max_num_seqs: 256,
            max_num_batched_tokens: 2048,
            max_model_len: 16_384,
            step_base_s: 0.032,
            decode_per_seq_s: 0.000_250,
            prefill_per_token_s: 0.000_250,
            kv_read_per_token_s: 0.000_000_250,
            lora_load_s: 0.200,
        }
    }

    /// Looks a profile up by its command-line name.
    pub fn by_name(name: &str) -> Result<Self, UnknownProfile> {
        match name.trim().to_ascii_lowercase().as_str() {
            "h100" => Ok(Self::h100()),
            "a10g" => Ok(Self::a10g()),
            other => Err(UnknownProfile {
                name: other.to_string(),
            }),
        }
    }

    /// The same profile with every time divided by `speedup` (values ≤ 0 are treated as 1).
    pub fn scaled(&self, speedup: f64) -> Self {
        let s = if speedup.is_finite() && speedup > 0.0 {
            speedup
        } else {
            1.0
        };
        Profile {
            step_base_s: self.step_base_s / s,
            decode_per_seq_s: self.decode_per_seq_s / s,
            prefill_per_token_s: self.prefill_per_token_s / s,
            kv_read_per_token_s: self.kv_read_per_token_s / s,
            lora_load_s: self.lora_load_s / s,
            ..self.clone()
        }
    }

    /// KV capacity in tokens.
    pub fn kv_tokens(&self) -> u64 {
        u64::from(self.num_gpu_blocks) * u64::from(self.block_size)
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a10g_is_smaller_and_slower() {
        let (h, a) = (Profile::h100(), Profile::a10g());
        assert!(a.num_gpu_blocks * 8 < h.num_gpu_blocks);
        assert!(a.step_base_s > 3.0 * h.step_base_s);
        assert!(a.prefill_per_token_s > 3.0 * h.prefill_per_token_s);
    }

    #[test]
    fn speedup_divides_times() {
        let h = Profile::h100().scaled(10.0);
        assert!((h.step_base_s - 0.00065).abs() < 1e-12);
        assert_eq!(h.num_gpu_blocks, 28_000);
        assert_eq!(Profile::h100().scaled(0.0), Profile::h100());
    }

    #[test]
    fn names() {
        assert_eq!(
            Profile::by_name(" A10G").map(|p| p.name).ok(),
            Some("a10g".into())
        );
        assert!(Profile::by_name("tpu").is_err());
    }
}
