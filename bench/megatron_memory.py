#!/usr/bin/env python3
"""Megatron-LM's theoretical memory estimate, term by term, beside shardscope's plan.

Megatron-LM prints, at the start of training, a "theoretical memory footprint"
(megatron/training/theoretical_memory_usage.py) for the most loaded rank: the first
pipeline stage's shard of the weights and optimizer, and that stage's activations. This
script evaluates the same closed forms (restated here from their published definitions;
the paper is Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", Table 2) for a transformer given by a Hugging Face config.json or by
flags, and prints each term, so that docs/results.md can set them beside shardscope's
`plan` for the same rank and say where the two differ.

What Megatron's estimate counts:
  weights and optimizer  parameters on the most loaded shard x bytes per parameter, where
                         the shard is (transformer layers / pp + the embedding) / tp (the
                         untied output layer too when pp == 1), and a parameter costs 18 B
                         (bf16 weight 2, fp32 gradient 4, fp32 master weight 4, Adam's two
                         fp32 moments 8) or 6 + 12/dp B with the distributed optimizer.
                         The layer's parameters are its attention projections, its MLP and
                         its norms; Linear biases and learned position embeddings are not
                         counted.
  activations            bf16 activations of the first stage, which holds pp micro-batches
                         in flight (fewer when M < pp):
                           with --sequence-parallel and selective recompute:
                             s b h (18 + 4 ffn/h) per layer, x layers, + the embedding's
                             input (8 s b pp) and dropout mask (s b h pp), / tp;
                           otherwise:
                             s b h (10 + 24/tp) per layer, x layers, + the same embedding
                             terms, and x 1.05 for "temporaries".
                         When pp == 1 the output layer's input and the logits are added.
What it leaves out (and shardscope counts): gradient buckets and communication buffers,
the optimizer's step counters, the logits and cross-entropy's saved tensors on the last
stage when pp > 1, every transient of a step's peak (a layer's backward workspace, the
gradient being formed), and the other stages.

Usage:
  bench/megatron_memory.py --hf-config tests/data/hf/llama-2-7b.json --seq 4096 --micro-batch 1 \
      --tp 2 --pp 2 --dp 2 --microbatches 8 [--sp] [--distributed-optimizer] [--json]
  bench/megatron_memory.py --layers 12 --hidden 768 --heads 12 --ffn 3072 --vocab 50304 --norm layernorm ...
Prints bytes (not MiB), one term a line, then the total.
"""
import argparse
import json
import sys


def shape_from_args(a):
    if a.hf_config:
        with open(a.hf_config) as f:
            c = json.load(f)
        llama = c.get("model_type") in ("llama", "qwen2", "mistral") or "num_key_value_heads" in c
        if llama:
            hidden = c["hidden_size"]
            heads = c["num_attention_heads"]
            return dict(layers=c["num_hidden_layers"], hidden=hidden, heads=heads,
                        kv_heads=c.get("num_key_value_heads", heads), ffn=c["intermediate_size"],
                        vocab=c["vocab_size"], swiglu=True, norm="rmsnorm",
                        tied=bool(c.get("tie_word_embeddings", False)))
        hidden = c["n_embd"]
        return dict(layers=c["n_layer"], hidden=hidden, heads=c["n_head"], kv_heads=c["n_head"],
                    ffn=c.get("n_inner") or 4 * hidden, vocab=c["vocab_size"], swiglu=False,
                    norm="layernorm", tied=True)
    for name in ("layers", "hidden", "heads", "ffn", "vocab"):
        if getattr(a, name) is None:
            sys.exit(f"megatron_memory.py: --{name} is needed without --hf-config")
    return dict(layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads or a.heads, ffn=a.ffn,
                vocab=a.vocab, swiglu=a.swiglu, norm=a.norm, tied=not a.untied)


def megatron_terms(m, seq, micro_batch, tp, pp, dp, microbatches, sp, distributed_optimizer, vocab_padded):
    """Every term of Megatron's estimate, in bytes, as an ordered list of (name, value)."""
    h, L, ffn = m["hidden"], m["layers"], m["ffn"]
    norm_size = 1 if m["norm"] == "rmsnorm" else 2
    gated = 1.5 if m["swiglu"] else 1.0
    # Attention: Q and the output projection are h x h each, K and V h x (h kv/heads) each.
    attention = 2 * h * h * (1 + m["kv_heads"] / m["heads"])
    per_layer = 2 * h * (ffn * gated + norm_size) + attention
    embedding = h * vocab_padded
    block = per_layer * L + norm_size * h  # the final norm belongs to the block
    shard = (block / pp + embedding) / tp
    if not m["tied"] and pp == 1:
        shard += embedding / tp
    per_param = 6 + 12 / dp if distributed_optimizer else 18
    terms = [("parameters on the first stage's tp shard", shard),
             ("bytes per parameter", per_param),
             ("weights and optimizer", shard * per_param)]

    s, b = seq, micro_batch
    in_flight = min(1.0, microbatches / pp) if pp > 1 else 1.0
    embed_terms = 8 * s * b * pp + s * b * h * pp
    if sp:
        layers_act = s * b * h * (18 + 4 * ffn / h) * L
        act = (layers_act + embed_terms) * in_flight
        output = s * b * h * 4 * (1 + vocab_padded / h) if pp == 1 else 0
        act = (act + output) / tp
        terms += [("activations: layers (sbh(18+4ffn/h) L)", layers_act / tp * in_flight),
                  ("activations: embedding input and dropout", embed_terms / tp * in_flight),
                  ("activations: output layer and loss (pp = 1)", output / tp)]
    else:
        layers_act = s * b * h * (10 + 24 / tp) * L
        act = (layers_act + embed_terms) * in_flight
        output = (s * b * vocab_padded / tp + s * b * h) * 2 if pp == 1 else 0
        act = (act + output) * 1.05
        terms += [("activations: layers (sbh(10+24/tp) L)", layers_act * in_flight),
                  ("activations: embedding input and dropout", embed_terms * in_flight),
                  ("activations: output layer and loss (pp = 1)", output),
                  ("activations: the 5% for temporaries", act / 1.05 * 0.05)]
    terms.append(("activations", act))
    terms.append(("total", shard * per_param + act))
    return terms


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hf-config")
    p.add_argument("--layers", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--kv-heads", type=int)
    p.add_argument("--ffn", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--swiglu", action="store_true")
    p.add_argument("--norm", choices=("layernorm", "rmsnorm"), default="layernorm")
    p.add_argument("--untied", action="store_true")
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--microbatches", type=int)
    p.add_argument("--sp", action="store_true", help="--sequence-parallel with selective recompute")
    p.add_argument("--distributed-optimizer", action="store_true")
    p.add_argument("--divisible-by", type=int, default=128,
                   help="Megatron's --make-vocab-size-divisible-by (the vocabulary is padded to a multiple of it x tp)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    m = shape_from_args(a)
    step = a.divisible_by * a.tp
    padded = -(-m["vocab"] // step) * step
    terms = megatron_terms(m, a.seq, a.micro_batch, a.tp, a.pp, a.dp,
                           a.microbatches if a.microbatches is not None else a.pp, a.sp,
                           a.distributed_optimizer, padded)
    if a.json:
        print(json.dumps({"padded_vocab": padded, "terms": dict(terms)}, indent=1))
        return
    print(f"padded vocabulary: {padded}")
    for name, value in terms:
        print(f"{name:48s} {value:20,.0f}")


if __name__ == "__main__":
    main()
