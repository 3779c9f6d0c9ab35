#!/usr/bin/env python3
"""What Hugging Face's LlamaForCausalLM saves for backward in eager torch, after forward + loss.

The module is transformers' LlamaForCausalLM (fp32, CPU, train mode, untied head unless
--tied), or with --model-type qwen2 its Qwen2ForCausalLM (q, k, v biases), built from a
config of the given shape; the loss is the model's own
(labels = the input ids: HF shifts them inside). Every tensor autograd saves during
forward and loss passes through torch.autograd.graph.saved_tensors_hooks; the figure is
the unique untyped storages among them, parameters excluded, and their bytes: what is
held for backward when the forward, loss included, has ended. shardscope's
`saved.after_forward_bytes` and `saved.after_forward_tensors` count the same for
`--model llama`; docs/results.md sets the two side by side and itemizes the difference.

--attention picks HF's attn_implementation and SDPA's backend:
  eager       repeat_kv, matmul, softmax (the probabilities saved)
  sdpa        F.scaled_dot_product_attention as HF calls it (on the CPU torch's flash
              kernel: q, k, v, the output and the log-sum-exp saved)
  sdpa-math   the same call under SDPBackend.MATH
  all         the three, one line each
--checkpoint none|full|every:K: HF's gradient checkpointing (gradient_checkpointing_enable
with use_reentrant=False: torch.utils.checkpoint around each decoder layer, its hidden
states the one tensor argument), then every layer but 0, K, 2K, ... unwrapped again; the
checkpoint's empty dummy tensor holds no bytes and is not counted.
--precision fp32|bf16|both (default fp32): bf16 runs the forward and loss under
torch.autocast("cpu", dtype=torch.bfloat16) (parameters fp32; each Linear's GEMM in bf16 on
bf16 casts of its input and weight; the norms, softmax and loss in fp32). A Linear's weight
cast (autocast's cast cache; autograd holds it until that Linear's backward) is a saved
storage that is no parameter: counted, and reported apart as param_cast. --precision module
casts the module to bf16 and runs no autocast (FSDP's MixedPrecision(param_dtype=bf16) runs
the gathered bf16 unit so; DeepSpeed's bf16 casts the module).
--itemize lists each saved storage (bytes, shape, dtype) in the order first saved, with
the autograd nodes that saved it (and "param_cast" for a weight's bf16 cast).
With --shardscope BINARY, runs `BINARY run --model llama ...` on the same shape (one
step, one rank; flash beside sdpa, math beside eager and sdpa-math; --precision module:
`--precision bf16 --strategy zero3 --emulate 2:0`, Llama's bf16 module under FSDP's
MixedPrecision) and prints its figures beside HF's.

Prints one line per attention mode:
  [<precision> ]<mode> hf <bytes> B in <n> storages[ (param_cast <bytes> B in <n>)]
      [shardscope <mode> <bytes> B in <n> storages, hf - ours <bytes> B]
(the precision and param_cast parts under bf16 only).
Exit status 0; 2 when torch or transformers cannot be imported.
torch and transformers are dependencies of this script only (a bench), never of the build.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def is_param_cast(torch, t, params):
    """Whether saved tensor t is a bf16 cast of a parameter (autocast's cast cache), as saved: t or t.T."""
    if t.dtype != torch.bfloat16:
        return False
    for p in params:
        if p.numel() != t.numel():
            continue
        cast = p.detach().to(torch.bfloat16)
        for view in (cast, cast.t()) if cast.dim() == 2 else (cast,):
            if view.shape == t.shape and torch.equal(view, t.detach()):
                return True
    return False


def hf_saved(torch, transformers, args, mode, precision="fp32"):
    """(bytes, storages, items) HF's LlamaForCausalLM holds for backward after forward + loss."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(args.seed)
    shape = dict(
        hidden_size=args.hidden, intermediate_size=args.ffn, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
        max_position_embeddings=max(args.seq, 64), tie_word_embeddings=args.tied,
        attn_implementation="eager" if mode == "eager" else "sdpa")
    if args.model_type == "qwen2":  # q, k, v biases
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**shape))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(attention_bias=args.attention_bias, **shape))
    model.train()
    if precision == "module":  # FSDP's MixedPrecision(param_dtype=bf16): the module in bf16, no autocast
        model = model.to(torch.bfloat16)
    if args.checkpoint != "none":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        k = 1 if args.checkpoint == "full" else int(args.checkpoint.split(":", 1)[1])
        for i, layer in enumerate(model.model.layers):
            layer.gradient_checkpointing = i % k == 0
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    ids = torch.randint(0, args.vocab, (args.batch, args.seq))
    seen = {}  # storage pointer -> [bytes, shape, dtype, savers, param_cast], in the order first saved
    keep = []  # the saved tensors, to tell a weight's cast once the forward is done

    def pack(t):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in params and key not in seen and storage.nbytes() > 0:
            seen[key] = [storage.nbytes(), tuple(t.shape), str(t.dtype), set(), False]
            keep.append((key, t))
        return t

    import contextlib
    backend = sdpa_kernel(SDPBackend.MATH) if mode == "sdpa-math" else contextlib.nullcontext()
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16"
                else contextlib.nullcontext())
    with backend, autocast, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=ids, labels=ids)
    weights = list(model.parameters())
    for key, t in keep:
        seen[key][4] = is_param_cast(torch, t, weights)
    # Name the nodes that saved each storage (walking the graph from the loss).
    stack, visited = [out.loss.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        for attr in dir(node):
            if attr.startswith("_saved_"):
                try:
                    value = getattr(node, attr)
                except Exception:
                    continue
                if isinstance(value, torch.Tensor):
                    key = value.untyped_storage().data_ptr()
                    if key in seen:
                        seen[key][3].add(node.name() + "." + attr[len("_saved_"):])
        stack.extend(n for n, _ in node.next_functions)
    items = list(seen.values())
    return sum(i[0] for i in items), len(items), items


class ShardscopeRefused(Exception):
    """shardscope exited non-zero; the message is its last stderr line."""


def shardscope_saved(binary, args, mode, precision="fp32"):
    """(bytes, storages) of `binary run --model llama` on the shape: one step, one rank."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run.json")
        cmd = [binary, "run", "--model", "llama", "--layers", str(args.layers), "--hidden", str(args.hidden),
               "--heads", str(args.heads), "--kv-heads", str(args.kv_heads), "--ffn", str(args.ffn),
               "--vocab", str(args.vocab), "--seq", str(args.seq), "--batch", str(args.batch),
               "--attention", mode, "--strategy", "ddp", "--steps", "1",
               "--backend", "cpu", "--checkpoint", args.checkpoint, "--json", path]
        if precision == "module":  # the bf16 module: FSDP's MixedPrecision (zero3, emulated rank 0 of 2)
            cmd[cmd.index("ddp")] = "zero3"
            cmd[-2:-2] = ["--precision", "bf16", "--emulate", "2:0"]
        elif precision != "fp32":
            cmd[-2:-2] = ["--precision", precision]
        # The shape flags alone describe llama; qwen2's biases and a tied head come from a config.
        if args.model_type == "qwen2" or args.tied or args.attention_bias:
            config = os.path.join(tmp, "config.json")
            with open(config, "w") as f:
                json.dump({"model_type": args.model_type, "hidden_size": args.hidden, "intermediate_size": args.ffn,
                           "num_hidden_layers": args.layers, "num_attention_heads": args.heads,
                           "num_key_value_heads": args.kv_heads, "vocab_size": args.vocab,
                           "max_position_embeddings": max(args.seq, 64), "tie_word_embeddings": args.tied,
                           "attention_bias": args.attention_bias}, f)
            cmd[2:4] = ["--hf-config", config]
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:  # refused (exit 2: a configuration not built) or failed
            lines = done.stderr.strip().splitlines()
            raise ShardscopeRefused(lines[-1] if lines else f"exit {done.returncode}")
        with open(path) as f:
            doc = json.load(f)
    rank = doc["runs"][0]["ranks"][0]
    saved = rank["saved"]
    return saved["after_forward_bytes"], saved["after_forward_tensors"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--ffn", type=int, default=160)
    p.add_argument("--vocab", type=int, default=100)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--model-type", choices=["llama", "qwen2"], default="llama")
    p.add_argument("--tied", action="store_true")
    p.add_argument("--attention-bias", action="store_true")
    p.add_argument("--attention", choices=["eager", "sdpa", "sdpa-math", "all"], default="all")
    p.add_argument("--checkpoint", default="none", help="none | full | every:K (default none)")
    p.add_argument("--precision", choices=["fp32", "bf16", "both", "module"], default="fp32")
    p.add_argument("--itemize", action="store_true")
    p.add_argument("--shardscope", metavar="BINARY")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"hf_llama_saved: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    modes = ["eager", "sdpa", "sdpa-math"] if args.attention == "all" else [args.attention]
    for precision in ["fp32", "bf16"] if args.precision == "both" else [args.precision]:
        for mode in modes:
            total, count, items = hf_saved(torch, transformers, args, mode, precision)
            line = f"{mode} hf {total} B in {count} storages"
            if precision != "fp32":
                casts = [i for i in items if i[4]]
                line = f"{precision} {line} (param_cast {sum(i[0] for i in casts)} B in {len(casts)})"
            if args.shardscope:
                ours_mode = "flash" if mode == "sdpa" else "math"
                try:
                    b, n = shardscope_saved(args.shardscope, args, ours_mode, precision)
                    line += f" shardscope {ours_mode} {b} B in {n} storages, hf - ours {total - b} B"
                except ShardscopeRefused as e:
                    line += f" shardscope did not run ({e})"
            print(line)
            if args.itemize:
                for nbytes, shape, dtype, savers, cast in items:
                    print(f"    {nbytes:>10} {str(shape):<22} {dtype:<14} {', '.join(sorted(savers))}"
                          f"{'  param_cast' if cast else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
