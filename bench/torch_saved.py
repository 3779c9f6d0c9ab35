#!/usr/bin/env python3
"""What torch eager autograd saves for backward in nanoGPT's GPT, after forward + loss.

The module is nanoGPT's (token and position embeddings, blocks of LayerNorm, a fused QKV
Linear, F.scaled_dot_product_attention(is_causal=True), the output Linear, LayerNorm,
Linear h -> 4h, GELU(approximate="tanh"), Linear 4h -> h; ln_f; lm_head tied to wte;
F.cross_entropy over the vocabulary), fp32 on the CPU (parameters fp32 always; with
--precision bf16 the forward and loss run under torch.autocast("cpu", dtype=torch.bfloat16),
as torch's mixed precision does: the Linears' GEMMs in bf16 on bf16 casts of their input
and weight, LayerNorm, softmax and the loss in fp32). Every tensor autograd saves
during forward and loss passes through torch.autograd.graph.saved_tensors_hooks; the
figure is the unique untyped storages among them, parameters excluded, and their bytes:
what is held for backward when the forward, loss included, has ended. shardscope's
`saved.after_forward_bytes` and `saved.after_forward_tensors` (every data-parallel rank
record) count the same.

--attention math|flash|both picks SDPA's backend (SDPBackend.MATH materialises the
probabilities; SDPBackend.FLASH_ATTENTION saves the output and the log-sum-exp).
--checkpoint none|full|every:K wraps transformer blocks 0, K, 2K, ... (full: every
block; the embeddings, ln_f and the head never) in torch.utils.checkpoint.checkpoint(
block, x, use_reentrant=False): autograd then saves the wrapped block's input alone
(through _NoopSaveInputs, beside an empty tensor, which holds no bytes and is not
counted), the block's own saves going to the checkpoint's holders. --checkpoint attention
wraps only each block's F.scaled_dot_product_attention(q, k, v) call in the same
checkpoint (the attention core, as Megatron's selective recompute draws it): autograd
saves its inputs q, k, v (views of c_attn's output) instead of what SDPA saves inside.
--precision fp32|bf16|both (default fp32). Under autocast a Linear saves a bf16 cast of its
weight (autocast's cast cache makes it once per forward; autograd holds it until that
Linear's backward): a storage that is no parameter, counted among the saved storages as
torch's hooks see it, and reported apart as param_cast (a saved bf16 tensor equal to a
parameter's bf16 cast, transposed or not).
--itemize lists each saved storage (bytes, shape, dtype, the autograd nodes that saved it,
and "param_cast" for a weight's cast) in the order it was saved.
With --shardscope BINARY, runs `BINARY run --model gpt2 ...` on the same shape (one
step, one rank) and prints its figures beside torch's.

Prints one line per attention mode:
  [<precision> ]<mode> torch <bytes> B in <n> storages[ (param_cast <bytes> B in <n>)]
      [shardscope <bytes> B in <n> storages, equal|DIFFERENT]
(the precision and param_cast parts under bf16 only, so fp32's lines read as before).
Exit status 0; 1 when a shardscope figure differs or shardscope does not run the
configuration (its error line is printed); 2 when torch cannot be imported.
torch is a dependency of this script only (a bench), never of the build or its tests.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def wraps(checkpoint, i):
    """Whether transformer block i is checkpointed under --checkpoint."""
    if checkpoint in ("none", "attention"):
        return False
    k = 1 if checkpoint == "full" else int(checkpoint.split(":", 1)[1])
    return i % k == 0


def build_gpt(torch, layers, hidden, heads, vocab, positions, checkpoint="none"):
    nn = torch.nn
    F = torch.nn.functional

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(hidden, 3 * hidden)
            self.c_proj = nn.Linear(hidden, hidden)

        def forward(self, x):
            b, t, c = x.size()
            q, k, v = self.c_attn(x).split(hidden, dim=2)
            q = q.view(b, t, heads, c // heads).transpose(1, 2)
            k = k.view(b, t, heads, c // heads).transpose(1, 2)
            v = v.view(b, t, heads, c // heads).transpose(1, 2)
            if checkpoint == "attention":
                y = torch.utils.checkpoint.checkpoint(F.scaled_dot_product_attention, q, k, v, is_causal=True,
                                                      use_reentrant=False)
            else:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(hidden, 4 * hidden)
            self.gelu = nn.GELU(approximate="tanh")
            self.c_proj = nn.Linear(4 * hidden, hidden)

        def forward(self, x):
            return self.c_proj(self.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(hidden)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(hidden)
            self.mlp = Mlp()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, hidden)
            self.wpe = nn.Embedding(positions, hidden)
            self.h = nn.ModuleList([Block() for _ in range(layers)])
            self.ln_f = nn.LayerNorm(hidden)
            self.lm_head = nn.Linear(hidden, vocab, bias=False)
            self.lm_head.weight = self.wte.weight  # tied, as nanoGPT

        def forward(self, idx, targets):
            pos = torch.arange(0, idx.size(1), dtype=torch.long)
            x = self.wte(idx) + self.wpe(pos)
            for i, block in enumerate(self.h):
                if wraps(checkpoint, i):
                    x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
                else:
                    x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    return Gpt()


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


def saved_nodes(loss, seen):
    """Name, for each storage in seen, the autograd nodes (and their slots) that saved it."""
    import torch
    stack, visited = [loss.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        for attr in dir(node):
            if not attr.startswith("_saved_"):
                continue
            try:
                value = getattr(node, attr)
            except Exception:
                continue
            if isinstance(value, torch.Tensor):
                key = value.untyped_storage().data_ptr()
                if key in seen:
                    seen[key]["savers"].add(node.name() + "." + attr[len("_saved_"):])
        stack.extend(n for n, _ in node.next_functions)


def torch_saved(torch, args, mode, precision="fp32"):
    """(bytes, storages, items) torch holds for backward after forward + loss; each item a
    dict of bytes, shape, dtype, savers and cast (a parameter's bf16 cast)."""
    import contextlib
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(args.seed)
    model = build_gpt(torch, args.layers, args.hidden, args.heads, args.vocab, args.positions, args.checkpoint)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    idx = torch.randint(0, args.vocab, (args.batch, args.seq))
    targets = torch.randint(0, args.vocab, (args.batch, args.seq))
    seen = {}  # storage pointer -> item, in the order first saved
    keep = []  # the saved tensors themselves, to tell a weight's cast once the forward is done

    def pack(t):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in params and key not in seen and storage.nbytes() > 0:
            seen[key] = {"bytes": storage.nbytes(), "shape": tuple(t.shape), "dtype": str(t.dtype),
                         "savers": set(), "cast": False}
            keep.append((key, t))
        return t

    backend = SDPBackend.MATH if mode == "math" else SDPBackend.FLASH_ATTENTION
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16"
                else contextlib.nullcontext())
    if precision == "module":  # FSDP's MixedPrecision(param_dtype=bf16): the module in bf16, no autocast
        model = model.to(torch.bfloat16)
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with sdpa_kernel(backend), autocast, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(idx, targets)
    saved_nodes(loss, seen)
    weights = list(model.parameters())
    for key, t in keep:
        seen[key]["cast"] = is_param_cast(torch, t, weights)
    del loss
    items = list(seen.values())
    return sum(i["bytes"] for i in items), len(items), items


class ShardscopeRefused(Exception):
    """shardscope exited non-zero; the message is its last stderr line."""


def shardscope_saved(binary, args, mode, precision="fp32"):
    """(bytes, storages) of rank 0's saved.after_forward_* from one step of `binary`."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run.json")
        cmd = [binary, "run", "--model", "gpt2", "--layers", str(args.layers), "--hidden", str(args.hidden),
               "--heads", str(args.heads), "--vocab", str(args.vocab), "--seq", str(args.seq),
               "--positions", str(args.positions), "--batch", str(args.batch), "--attention", mode,
               "--steps", "1", "--backend", "cpu", "--checkpoint", args.checkpoint, "--json", out]
        if precision != "fp32":
            cmd[-2:-2] = ["--precision", precision]
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:  # refused (exit 2: a configuration not built) or failed
            lines = done.stderr.strip().splitlines()
            raise ShardscopeRefused(lines[-1] if lines else f"exit {done.returncode}")
        with open(out) as f:
            doc = json.load(f)
    saved = doc["runs"][0]["ranks"][0]["saved"]
    return saved["after_forward_bytes"], saved["after_forward_tensors"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=100)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--positions", type=int, default=0, help="learned positions (default: --seq)")
    ap.add_argument("--batch", type=int, default=2, help="sequences")
    ap.add_argument("--attention", choices=["math", "flash", "both"], default="both")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint", default="none", help="none | full | every:K | attention (default none)")
    ap.add_argument("--precision", choices=["fp32", "bf16", "both", "module"], default="fp32",
                    help="fp32, or bf16 under torch.autocast('cpu', bfloat16) (default fp32)")
    ap.add_argument("--itemize", action="store_true", help="list every saved storage")
    ap.add_argument("--shardscope", metavar="BINARY", help="also run BINARY on the same shape")
    args = ap.parse_args()
    if args.positions == 0:
        args.positions = args.seq
    try:
        import torch
    except ImportError as e:
        print(f"torch_saved.py: error: cannot import torch ({e})", file=sys.stderr)
        return 2
    torch.set_num_threads(1)

    status = 0
    precisions = ["fp32", "bf16"] if args.precision == "both" else [args.precision]
    for precision in precisions:
        for mode in (["math", "flash"] if args.attention == "both" else [args.attention]):
            nbytes, count, items = torch_saved(torch, args, mode, precision)
            line = f"{mode} torch {nbytes} B in {count} storages"
            if precision != "fp32":
                casts = [i for i in items if i["cast"]]
                line = f"{precision} {line} (param_cast {sum(i['bytes'] for i in casts)} B in {len(casts)})"
            if args.shardscope:
                try:
                    ours, ours_count = shardscope_saved(args.shardscope, args, mode, precision)
                    same = ours == nbytes and ours_count == count
                    line += f" shardscope {ours} B in {ours_count} storages, {'equal' if same else 'DIFFERENT'}"
                except ShardscopeRefused as e:
                    same = False
                    line += f" shardscope did not run ({e})"
                status = status or (0 if same else 1)
            print(line)
            if args.itemize:
                for i in items:
                    cast = "  param_cast" if i["cast"] else ""
                    print(f"  {i['bytes']:>12} B  {str(i['shape']):<18} {i['dtype']:<15} "
                          f"{', '.join(sorted(i['savers']))}{cast}")
    return status


if __name__ == "__main__":
    sys.exit(main())
