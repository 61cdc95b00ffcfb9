//! GPU profiles: the one place where the emulator's hardware defaults live.
//!
//! Every number here is explained, with its public source, in `CALIBRATION.md` beside
//! `Cargo.toml`. Change a default there and here together.

use std::fmt;

/// Speed and memory of one emulated GPU (or tensor-parallel GPU group) serving one model.
///
/// Step time of one engine iteration (see `engine.rs`):
/// `step_base_s + decode_seqs * decode_per_seq_s + prefill_tokens * prefill_per_token_s +
/// prefill_attention_pairs * prefill_attn_s + context_tokens * kv_read_per_token_s +
/// disk_loads * lora_load_s + cpu_swap_ins * lora_cpu_load_s`, where `prefill_attention_pairs`
/// is the sum over prefill tokens of the context each one attends to (so a prompt's prefill
/// grows with the square of its length).
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
    /// Attention cost of one prefill token per context token it attends to (seconds): the
    /// part of prefill that grows with context length.
    pub prefill_attn_s: f64,
    /// Cost per token of KV context read by the batch's attention (seconds).
    pub kv_read_per_token_s: f64,
    /// Time to load one LoRA adapter from disk into a GPU slot (not in the CPU cache; seconds).
    pub lora_load_s: f64,
    /// Time to swap one LoRA adapter from the CPU cache into a GPU slot (seconds).
    pub lora_cpu_load_s: f64,
    /// The server's own time per request outside the engine's steps (HTTP, chat template,
    /// tokenisation, detokenisation and streaming; seconds): a request enters the engine this
    /// long after it arrived. 0 for the GPU profiles (small next to their steps, and not in
    /// their public figures); measured for the CPU twins, whose steps are milliseconds.
    pub request_overhead_s: f64,
}

/// Attention FLOPs of one token per context token (QK^T and A·V: 4 · layers · hidden) over
/// the linear FLOPs of one token (2 · parameters), Llama-3.1-8B: 4·32·4096 / (2·8.03e9).
const ATTN_PER_CONTEXT_8B: f64 = 4.0 * 32.0 * 4096.0 / (2.0 * 8.03e9);
/// The same ratio for Llama-3.1-70B: 4·80·8192 / (2·70.6e9).
const ATTN_PER_CONTEXT_70B: f64 = 4.0 * 80.0 * 8192.0 / (2.0 * 70.6e9);

/// Names accepted by [`Profile::by_name`].
pub const PROFILE_NAMES: &[&str] = &["h100", "a10g", "h100-70b", "cpu-small", "cpu-large"];

/// Prompt characters per token of the project's tiny test model's tokenizer on the
/// benchmark's word text, chat template included (`bench calibrate --fit`: 5.22, the median
/// over 105 prompts of 64–3,000 model-sim tokens): the CPU profiles
/// count in model-sim's tokens (4 characters), so the real engine's token quantities (block
/// size, batch budget, model length) are scaled by this ÷ 4.
pub const TINY_CHARS_PER_TOKEN: f64 = 5.2;

/// A quantity of the tiny model's tokens in model-sim's 4-character tokens.
fn tiny_tokens(n: u32) -> u32 {
    (f64::from(n) * TINY_CHARS_PER_TOKEN / 4.0).round() as u32
}

/// Error for an unknown profile name.
#[derive(Debug, thiserror::Error)]
#[error("unknown GPU profile {name:?} (known: h100, a10g, h100-70b, cpu-small, cpu-large)")]
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
            prefill_attn_s: 0.000_040 * ATTN_PER_CONTEXT_8B,
            kv_read_per_token_s: 0.000_000_045,
            lora_load_s: 0.100,
            lora_cpu_load_s: 0.005,
            request_overhead_s: 0.0,
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
            prefill_attn_s: 0.000_250 * ATTN_PER_CONTEXT_8B,
            kv_read_per_token_s: 0.000_000_250,
            lora_load_s: 0.200,
            lora_cpu_load_s: 0.010,
            request_overhead_s: 0.0,
        }
    }

    /// Llama-3.1-70B-Instruct in bf16 on two H100 SXM 80 GB (tensor parallel 2) with vLLM
    /// defaults: the weights take most of the memory, so the KV cache holds few requests and
    /// bursts preempt.
    pub fn h100_70b() -> Self {
        Profile {
            name: "h100-70b".into(),
            block_size: 16,
            num_gpu_blocks: 1_800,
            max_num_seqs: 1024,
            max_num_batched_tokens: 8192,
            max_model_len: 16_384,
            step_base_s: 0.029,
            decode_per_seq_s: 0.000_178,
            prefill_per_token_s: 0.000_178,
            prefill_attn_s: 0.000_178 * ATTN_PER_CONTEXT_70B,
            kv_read_per_token_s: 0.000_000_056,
            lora_load_s: 0.300,
            lora_cpu_load_s: 0.010,
            request_overhead_s: 0.0,
        }
    }

    /// The twin of a real vLLM pod: vLLM 0.32's CPU build on one core serving the project's
    /// 5.5 M-parameter tiny model (test-harness/vllm), with vLLM's CPU defaults (128
    /// sequences, 2,048 batched tokens, 1 GiB of KV = 4,096 blocks of 128 tokens). The step
    /// terms are the least-squares fit of `bench calibrate --fit cpu-small` on a quiet machine
    /// (CALIBRATION.md, "The CPU twins": a fit taken while builds ran came out 2–3× slower);
    /// the real engine's token quantities are in model-sim tokens.
    pub fn cpu_small() -> Self {
        Profile {
            name: "cpu-small".into(),
            block_size: tiny_tokens(128),
            num_gpu_blocks: 4096,
            max_num_seqs: 128,
            max_num_batched_tokens: tiny_tokens(2048),
            max_model_len: tiny_tokens(4096),
            step_base_s: 0.003_06,
            decode_per_seq_s: 0.000_140,
            prefill_per_token_s: 0.000_005_72,
            prefill_attn_s: 0.000_000_004_5,
            kv_read_per_token_s: 0.000_000_077,
            lora_load_s: 0.0,
            lora_cpu_load_s: 0.0,
            request_overhead_s: 0.003_85,
        }
    }

    /// The twin of the 22 M-parameter tiny model on one core (the "slower GPU"; 1 GiB holds
    /// 1,024 of its blocks), fitted the same way (`bench calibrate --fit cpu-large`).
    pub fn cpu_large() -> Self {
        Profile {
            name: "cpu-large".into(),
            num_gpu_blocks: 1024,
            step_base_s: 0.005_66,
            decode_per_seq_s: 0.000_208,
            prefill_per_token_s: 0.000_057_2,
            prefill_attn_s: 0.000_000_003_8,
            kv_read_per_token_s: 0.000_000_544,
            request_overhead_s: 0.005_07,
            ..Self::cpu_small()
        }
    }

    /// Looks a profile up by its command-line name.
    pub fn by_name(name: &str) -> Result<Self, UnknownProfile> {
        match name.trim().to_ascii_lowercase().as_str() {
            "h100" => Ok(Self::h100()),
            "a10g" => Ok(Self::a10g()),
            "h100-70b" => Ok(Self::h100_70b()),
            "cpu-small" => Ok(Self::cpu_small()),
            "cpu-large" => Ok(Self::cpu_large()),
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
            prefill_attn_s: self.prefill_attn_s / s,
            kv_read_per_token_s: self.kv_read_per_token_s / s,
            lora_load_s: self.lora_load_s / s,
            lora_cpu_load_s: self.lora_cpu_load_s / s,
            request_overhead_s: self.request_overhead_s / s,
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
    fn seventy_b_holds_few_requests_and_attention_grows_with_context() {
        let (h, b) = (Profile::h100(), Profile::h100_70b());
        // A 2,000-token prompt with 500 output tokens needs 157 blocks: ~11 fit.
        assert!(b.num_gpu_blocks / 157 < 16);
        assert!(b.step_base_s > 3.0 * h.step_base_s);
        // At 8k context the attention term adds a quarter of the linear cost (8B).
        let extra = 8192.0 * h.prefill_attn_s / h.prefill_per_token_s;
        assert!((0.2..0.35).contains(&extra), "{extra}");
        assert_eq!(
            Profile::by_name("H100-70B").map(|p| p.name).ok(),
            Some("h100-70b".into())
        );
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
