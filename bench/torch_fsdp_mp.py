#!/usr/bin/env python3
"""torch's FSDP mixed precision (param_dtype bf16, reduce_dtype fp32) on the seed's model.

PyTorch runs the seed's model (docs/design.md §2: 8 x Linear(256, 256) + ReLU, MSE
against ones, torch.optim.AdamW with its defaults, batch 32 a rank, 3 steps) on CPU under
gloo, one process per rank, sharded as
  fsdp1-zero3-unit  FSDP1 FULL_SHARD, each Linear wrapped, then the root
  fsdp1-zero2-unit  FSDP1 SHARD_GRAD_OP, each Linear wrapped
  fsdp1-root        FSDP1 FULL_SHARD, no wrap policy (one root unit)
  fsdp2-zero3-unit  fully_shard on each Linear then the root, reshard_after_forward=True
  fsdp2-zero2-unit  the same, reshard_after_forward=False
  gpt2-fsdp1-zero3-block, gpt2-fsdp1-zero2-block, gpt2-fsdp2-zero3-block, gpt2-fsdp2-zero2-block
                    nanoGPT's GPT-2 (bench/torch_saved.py's module: 2 blocks, hidden 64, 4
                    heads, vocabulary 100, 16 tokens, 2 sequences a rank, tied head, flash
                    SDPA, cross-entropy on the ids) under FSDP1 FULL_SHARD / SHARD_GRAD_OP,
                    each Block wrapped, then the root (embeddings, ln_f, the head); or
                    fully_shard on each Block then the root
  llama-fsdp1-zero3-block, llama-fsdp1-zero2-block, llama-fsdp2-zero3-block, llama-fsdp2-zero2-block
                    transformers' LlamaForCausalLM (2 layers, hidden 64, 4 heads, 2 kv heads,
                    ffn 160, vocabulary 100, 16 tokens, 2 sequences a rank, untied head, SDPA
                    forced to flash, the model's own loss on labels = the ids) the same way,
                    each LlamaDecoderLayer wrapped, then the root (the embedding, the final
                    norm, lm_head)
with FSDP1's MixedPrecision(param_dtype=bfloat16, reduce_dtype=float32,
buffer_dtype=float32) or fully_shard's MixedPrecisionPolicy(param_dtype=bfloat16,
reduce_dtype=float32). Per rank it records (step 3 unless said):
  resting     c10's allocator total after the step (bench/torch_peaks.py explains the log),
              and the storages of the sharded parameters, gradients and AdamW state with
              their dtypes;
  collectives every all_gather_into_tensor / reduce_scatter_tensor / all_reduce the step
              issues (patched in torch.distributed): dtype, input and output elements;
  saved       what autograd saves in the forward (saved_tensors_hooks): each distinct
              storage's dtype and bytes, split into the gathered parameters' storages and
              the rest;
  loss        the dtype the model's output and the loss come out in;
  peak        the high-water mark of step 3 and its phase.
With --accumulate K each step runs K micro-steps (the loss scaled by 1/K), and with
--no-sync all but the last without gradient synchronization (FSDP1's no_sync(), fully_shard's
set_requires_gradient_sync(False)); after each micro-step's backward it records the
unsharded gradients torch keeps (FSDP1: each flat parameter's .grad; fully_shard: each
unsharded parameter's .grad): dtype and elements, and which collectives that micro-step
issued. With --checkpoint full|every:K the MLP's layers (Linear + ReLU, each its own unit)
run under torch.utils.checkpoint (non-reentrant) inside their FSDP unit; GPT-2 takes
bench/torch_saved.py's --checkpoint (attention: the SDPA core alone, inside the Block's unit).
With --shardscope BINARY it runs the same configuration with `--precision bf16 --emulate
W:r` for every rank and prints resting, peak and communicated bytes beside torch's.

Usage: bench/torch_fsdp_mp.py [--worlds 2,3,4] [--configs NAME,...] [--loss mse|sum]
                              [--accumulate K [--no-sync]] [--checkpoint MODE]
                              [--shardscope BINARY] [--json FILE]
torch is a dependency of this bench only (never of CI).
"""
import argparse
import collections
import contextlib
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_peaks  # noqa: E402  (the allocator log and the driver's helpers)

LAYERS, WIDTH, BATCH, STEPS = torch_peaks.LAYERS, torch_peaks.WIDTH, torch_peaks.BATCH, torch_peaks.STEPS
MARK = torch_peaks.MARK

# name -> (shardscope flags, engine, reshard / FULL_SHARD, wrap each Linear)
CONFIGS = {
    "fsdp1-zero3-unit": (["--strategy", "zero3", "--units", "1"], "fsdp1", True, True),
    "fsdp1-zero2-unit": (["--strategy", "zero2", "--units", "1"], "fsdp1", False, True),
    "fsdp1-root": (["--strategy", "zero3", "--units", "all"], "fsdp1", True, False),
    "fsdp2-zero3-unit": (["--strategy", "zero3", "--units", "1", "--engine", "fsdp2"], "fsdp2", True, True),
    "fsdp2-zero2-unit": (["--strategy", "zero2", "--units", "1", "--engine", "fsdp2"], "fsdp2", False, True),
    "gpt2-fsdp1-zero3-block": (["--strategy", "zero3", "--units", "1"], "fsdp1", True, "gpt2"),
    "gpt2-fsdp1-zero2-block": (["--strategy", "zero2", "--units", "1"], "fsdp1", False, "gpt2"),
    "gpt2-fsdp2-zero3-block": (["--strategy", "zero3", "--units", "1", "--engine", "fsdp2"], "fsdp2", True, "gpt2"),
    "gpt2-fsdp2-zero2-block": (["--strategy", "zero2", "--units", "1", "--engine", "fsdp2"], "fsdp2", False, "gpt2"),
    "llama-fsdp1-zero3-block": (["--strategy", "zero3", "--units", "1"], "fsdp1", True, "llama"),
    "llama-fsdp1-zero2-block": (["--strategy", "zero2", "--units", "1"], "fsdp1", False, "llama"),
    "llama-fsdp2-zero3-block": (["--strategy", "zero3", "--units", "1", "--engine", "fsdp2"], "fsdp2", True, "llama"),
    "llama-fsdp2-zero2-block": (["--strategy", "zero2", "--units", "1", "--engine", "fsdp2"], "fsdp2", False, "llama"),
}
# The GPT-2 configurations' shape, as shardscope's flags name it.
GPT2 = {"layers": 2, "hidden": 64, "heads": 4, "vocab": 100, "seq": 16, "positions": 16, "batch": 2}


def gpt2_flags():
    return ["--model", "gpt2"] + [x for k, v in GPT2.items() for x in (f"--{k}", str(v))]


# The Llama configurations' shape, as shardscope's flags name it (untied head, flash).
LLAMA = {"layers": 2, "hidden": 64, "heads": 4, "kv-heads": 2, "ffn": 160, "vocab": 100, "seq": 16, "batch": 2}


def llama_flags():
    return ["--model", "llama"] + [x for k, v in LLAMA.items() for x in (f"--{k}", str(v))]


def build_llama(torch):
    """transformers' LlamaForCausalLM of LLAMA's shape (sdpa, untied), in train mode."""
    import transformers
    g = LLAMA
    config = transformers.LlamaConfig(
        hidden_size=g["hidden"], intermediate_size=g["ffn"], num_hidden_layers=g["layers"],
        num_attention_heads=g["heads"], num_key_value_heads=g["kv-heads"], vocab_size=g["vocab"],
        max_position_embeddings=64, tie_word_embeddings=False, attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(config)
    model.train()
    return model, {transformers.models.llama.modeling_llama.LlamaDecoderLayer}


def mlp_layers(torch, checkpoint):
    """The MLP as L modules of Linear + ReLU, each its own unit; a wrapped one runs its body
    under torch's non-reentrant checkpoint inside the unit (FSDP's hooks around it)."""
    import torch_saved

    class Layer(torch.nn.Module):
        def __init__(self, wrapped):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU())
            self.wrapped = wrapped

        def forward(self, x):
            if self.wrapped:
                return torch.utils.checkpoint.checkpoint(self.body, x, use_reentrant=False)
            return self.body(x)

    model = torch.nn.Sequential(*[Layer(torch_saved.wraps(checkpoint, i)) for i in range(LAYERS)])
    return model, {Layer}


def build(config, torch, checkpoint="none"):
    _, engine, reshard, per_linear = CONFIGS[config]
    if per_linear == "llama":
        model, wrap = build_llama(torch)
    elif per_linear == "gpt2":
        import torch_saved
        g = GPT2
        model = torch_saved.build_gpt(torch, g["layers"], g["hidden"], g["heads"], g["vocab"], g["seq"],
                                      checkpoint=checkpoint)
        wrap = {type(model.h[0])}
    elif checkpoint != "none":
        model, wrap = mlp_layers(torch, checkpoint)
    else:
        mods = []
        for _ in range(LAYERS):
            mods += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
        model = torch.nn.Sequential(*mods)
        wrap = {torch.nn.Linear}
    if engine == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for m in model.modules():
            if type(m) in wrap:
                fully_shard(m, reshard_after_forward=reshard, mp_policy=mp)
        fully_shard(model, reshard_after_forward=reshard, mp_policy=mp)
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, buffer_dtype=torch.float32)
        strategy = ShardingStrategy.FULL_SHARD if reshard else ShardingStrategy.SHARD_GRAD_OP
        policy = ModuleWrapPolicy(wrap) if per_linear else None
        model = FSDP(model, sharding_strategy=strategy, auto_wrap_policy=policy, mixed_precision=mp,
                     device_id=torch.device("cpu"))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


class Collectives:
    """Every collective torch.distributed is asked for: kind, dtype, input and output elements."""

    # torch 2.15's fully_shard and FSDP1's reduce-scatter call the *_single forms (output
    # first, input second); FSDP1 all-gathers a CPU flat parameter with the list form.
    KINDS = {"all_gather": "all_gather", "all_gather_single": "all_gather", "reduce_scatter_single": "reduce_scatter",
             "all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
             "all_reduce": "all_reduce"}

    def __init__(self, dist):
        self.calls = []
        for fn, kind in self.KINDS.items():
            if hasattr(dist, fn):
                setattr(dist, fn, self.wrap(getattr(dist, fn), kind))

    def wrap(self, f, kind):
        def counted(*args, **kwargs):
            tensors = list(args) + [kwargs[k] for k in ("output", "input", "tensor", "output_tensor",
                                                         "input_tensor") if k in kwargs]
            if isinstance(tensors[0], (list, tuple)):  # all_gather(tensor_list, tensor)
                parts, inp = tensors[0], tensors[1]
                self.calls.append({"kind": kind, "dtype": str(inp.dtype).replace("torch.", ""), "in": inp.numel(),
                                   "out": sum(t.numel() for t in parts), "elem_bytes": inp.element_size()})
                return f(*args, **kwargs)
            tensors = [t for t in tensors if hasattr(t, "dtype")]
            if kind == "all_reduce":
                out = inp = tensors[0]
            else:
                out, inp = tensors[0], tensors[1]
            self.calls.append({"kind": kind, "dtype": str(inp.dtype).replace("torch.", ""),
                               "in": inp.numel(), "out": out.numel(), "elem_bytes": inp.element_size()})
            return f(*args, **kwargs)
        return counted


def worker(args):
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world)
    torch.manual_seed(args.rank)
    ledger = Collectives(dist)
    c10 = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
    ctypes.c_bool.in_dll(c10, "FLAGS_caffe2_report_cpu_memory_usage").value = True

    def mark(name):
        os.write(2, f"{MARK} {name}\n".encode())

    model, opt = build(args.config, torch, args.checkpoint)
    saved = {}  # the last forward's saved storages: address -> dtype, bytes, shape
    dtypes = {}
    fsdp2 = CONFIGS[args.config][1] == "fsdp2"
    micro = []  # the last step's micro-steps: the unsharded gradients kept after each, its collectives

    def pack(t):
        s = t.untyped_storage()
        saved.setdefault(s.data_ptr(), {"dtype": str(t.dtype).replace("torch.", ""), "bytes": s.nbytes(),
                                        "shape": list(t.shape)})
        return t

    def kept_gradients():
        """The unsharded gradients torch holds now, unit by unit: dtype and elements of each."""
        out = []
        if fsdp2:
            for m in model.modules():
                state = m._get_fsdp_state() if hasattr(m, "_get_fsdp_state") else None
                group = getattr(state, "_fsdp_param_group", None) if state is not None else None
                if group is None:
                    continue
                grads = []
                for fp in group.fsdp_params:
                    leaf = getattr(fp, "_unsharded_param", None)
                    g = None if leaf is None else leaf.grad
                    if g is not None:
                        grads.append([str(g.dtype).replace("torch.", ""), g.numel()])
                out.append(grads)
        else:
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            for m in FSDP.fsdp_modules(model):
                h = m._handle
                if h is None:
                    continue
                g = h.flat_param.grad
                out.append([] if g is None else [[str(g.dtype).replace("torch.", ""), g.numel(),
                                                   h.flat_param._padded_unsharded_size.numel()]])
        return out

    K = args.accumulate
    for step in range(STEPS):
        ledger.calls.clear()
        micro = []
        mark("step")
        family = CONFIGS[args.config][3]
        gpt2 = family in ("gpt2", "llama")
        opt.zero_grad(set_to_none=False)
        for k in range(K):
            saved.clear()
            if gpt2:
                if family == "llama":
                    x = torch.randint(0, LLAMA["vocab"], (LLAMA["batch"], LLAMA["seq"]))
                    target = x
                else:
                    x = torch.randint(0, GPT2["vocab"], (GPT2["batch"], GPT2["seq"]))
                    target = torch.randint(0, GPT2["vocab"], (GPT2["batch"], GPT2["seq"]))
            else:
                x = torch.rand(BATCH, WIDTH) * 2 - 1
                target = torch.ones(BATCH, WIDTH)
            sync = not args.no_sync or k == K - 1
            if fsdp2:
                model.set_requires_gradient_sync(sync)
            context = model.no_sync() if not sync and not fsdp2 else contextlib.nullcontext()
            before = len(ledger.calls)
            with context:
                mark("forward")
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    if gpt2:
                        from torch.nn.attention import SDPBackend, sdpa_kernel
                        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                            y = loss = (model(input_ids=x, labels=target).loss if family == "llama"
                                        else model(x, target)) / K
                    else:
                        y = model(x)
                        loss = (torch.nn.functional.mse_loss(y, target) if args.loss == "mse" else y.sum()) / K
                dtypes = {"output": str(y.dtype), "loss": str(loss.dtype)}
                mark("backward")
                loss.backward()
            micro.append({"sync": sync, "kept": kept_gradients(), "collectives": summarize(ledger.calls[before:])})
            del x, target, loss, y
        mark("optimizer")
        opt.step()
        mark("end")
    ctypes.c_bool.in_dll(c10, "FLAGS_caffe2_report_cpu_memory_usage").value = False
    # What rests, storage by storage (deduplicated), with dtypes.
    rest, rest_seen = collections.Counter(), set()

    def local(t):
        return t._local_tensor if hasattr(t, "_local_tensor") else t

    for p in model.parameters():
        for part, t in (("param", p), ("grad", p.grad)):
            if t is None:
                continue
            s = local(t).untyped_storage()
            if s.data_ptr() not in rest_seen:
                rest_seen.add(s.data_ptr())
                rest[f"{part} {str(t.dtype).replace('torch.', '')}"] += s.nbytes()
        for v in opt.state[p].values():
            t = local(v)
            s = t.untyped_storage()
            if s.nbytes() and s.data_ptr() not in rest_seen:
                rest_seen.add(s.data_ptr())
                rest[f"optim {str(t.dtype).replace('torch.', '')}"] += s.nbytes()
    with open(os.path.join(args.out, f"rank{args.rank}.json"), "w") as f:
        json.dump({"storages": dict(rest), "collectives": ledger.calls, "saved": list(saved.values()),
                   "dtypes": dtypes, "micro": micro}, f)
    dist.destroy_process_group()


def step_flags(args):
    """--accumulate, --no-sync and --checkpoint as given: the worker's and shardscope's flags alike."""
    flags = ["--accumulate", str(args.accumulate)] if args.accumulate > 1 else []
    flags += ["--no-sync"] if args.no_sync else []
    return flags + (["--checkpoint", args.checkpoint] if args.checkpoint != "none" else [])


def torch_ranks(config, world, loss, tmp, flags):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(torch_peaks.free_port()),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               TORCH_CPP_LOG_LEVEL="INFO")
    logs = [os.path.join(tmp, f"log{r}.txt") for r in range(world)]
    procs = []
    for r in range(world):
        with open(logs[r], "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--worker", "--config", config, "--world", str(world),
                 "--rank", str(r), "--loss", loss, "--out", tmp] + flags, env=env, stdout=subprocess.DEVNULL,
                stderr=log))
    errors = []
    for r, p in enumerate(procs):
        try:
            p.wait(timeout=600)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise RuntimeError(f"torch {config} W={world}: rank {r} did not finish in 600 s")
        if p.returncode != 0:
            tail = [l.strip() for l in open(logs[r], errors="replace") if "C10 " not in l][-3:]
            errors.append(f"rank {r}: exit {p.returncode}: {' '.join(tail)}")
    if errors:
        raise RuntimeError(f"torch {config} W={world}: " + "; ".join(errors))
    out = []
    for r in range(world):
        ranked = json.load(open(os.path.join(tmp, f"rank{r}.json")))
        ranked.update(torch_peaks.allocator_figures(logs[r]))
        out.append(ranked)
    return out


def summarize(calls):
    """Per (kind, dtype): calls, and bytes at nccl-tests' size (shardscope's ledger)."""
    out = collections.OrderedDict()
    for c in calls:
        key = f"{c['kind']} {c['dtype']}"
        size = c["out"] if c["kind"] == "all_gather" else c["in"]
        e = out.setdefault(key, {"calls": 0, "bytes": 0})
        e["calls"] += 1
        e["bytes"] += size * c["elem_bytes"]
    return out


def shardscope_ranks(binary, config, world, loss, tmp, flags):
    out = []
    for r in range(world):
        path = os.path.join(tmp, f"ss{r}.json")
        family = CONFIGS[config][3]
        model = gpt2_flags() if family == "gpt2" else llama_flags() if family == "llama" else \
            ["--layers", str(LAYERS), "--width", str(WIDTH), "--batch", str(BATCH), "--activation", "relu", "--loss", loss]
        cmd = [binary, "run", "--backend", "cpu", "--steps", str(STEPS), "--precision", "bf16", "--emulate",
               f"{world}:{r}", "--json", path] + model + CONFIGS[config][0] + flags
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        out.append(json.load(open(path))["runs"][0]["ranks"][0])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", default="2,3,4")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--loss", default="mse", choices=("mse", "sum"))
    ap.add_argument("--accumulate", type=int, default=1, help="micro-steps per optimizer step (default 1)")
    ap.add_argument("--no-sync", action="store_true", help="synchronize gradients in the last micro-step only")
    ap.add_argument("--checkpoint", default="none", help="none | full | every:K | attention (GPT-2)")
    ap.add_argument("--shardscope", help="run this binary beside torch")
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    try:
        worlds = [int(w) for w in args.worlds.split(",")]
    except ValueError:
        sys.exit(f"torch_fsdp_mp: --worlds: expected a list of integers, got {args.worlds!r}")
    configs = args.configs.split(",")
    for c in configs:
        if c not in CONFIGS:
            sys.exit(f"torch_fsdp_mp: --configs: unknown {c!r}; known: {', '.join(CONFIGS)}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch
    except ImportError:
        sys.exit(f"torch_fsdp_mp: PyTorch is not importable by {sys.executable}")
    print(f"torch {torch.__version__} (CPU, gloo), bf16 params, fp32 reduce; model {LAYERS} x {WIDTH}, "
          f"ReLU, {args.loss}, batch {BATCH}/rank, AdamW, step {STEPS}; " + (" ".join(step_flags(args)) or "one micro-step"))
    records = []
    for config in configs:
        for world in worlds:
            with tempfile.TemporaryDirectory() as tmp:
                theirs = torch_ranks(config, world, args.loss, tmp, step_flags(args))
                ours = shardscope_ranks(args.shardscope, config, world, args.loss, tmp, step_flags(args)) if args.shardscope \
                    else [None] * world
            print(f"\n{config}, W = {world}")
            for r, (t, o) in enumerate(zip(theirs, ours)):
                comm = summarize(t["collectives"])
                saved = collections.Counter()
                for s in t["saved"]:
                    saved[f"{s['dtype']} {s['bytes']}"] += 1
                print(f"  rank {r}: rest {t['resting']:,} (storages {t['storages']}), peak {t['peak']:,} "
                      f"({t['phase']}); output {t['dtypes']['output']}, loss {t['dtypes']['loss']}")
                print(f"    comm: " + "; ".join(f"{k}: {v['calls']} calls, {v['bytes']:,} B" for k, v in comm.items()))
                print(f"    saved storages: " + ", ".join(f"{n} x {k} B" for k, n in saved.items()))
                if args.accumulate > 1 and r == 0:
                    for k, ms in enumerate(t["micro"]):
                        kept = collections.Counter()
                        for unit in ms["kept"]:
                            for g in unit:
                                kept[g[0]] += g[1]
                        print(f"    micro-step {k} ({'sync' if ms['sync'] else 'no sync'}): kept unsharded gradients "
                              + (", ".join(f"{d} {n:,} elements" for d, n in kept.items()) or "none")
                              + f" in {sum(1 for u in ms['kept'] if u)} units; comm: "
                              + ("; ".join(f"{c} {v['calls']} calls {v['bytes']:,} B" for c, v in
                                           ms["collectives"].items()) or "none"))
                        if k == 0:
                            print(f"      per unit: {ms['kept']}")
                if o is not None:
                    ocomm = {k: v["bytes"] for k, v in o["comm"].items() if v["calls"]}
                    print(f"    ours: rest {o['resting']['total']:,}, peak {o['peak']['total']:,} "
                          f"({o['peak']['phase']}, {o['peak']['where']}), comm {ocomm}")
                records.append({"config": config, "world": world, "rank": r, "torch": t,
                                "shardscope": None if o is None else
                                {"resting": o["resting"], "peak": o["peak"], "comm": o["comm"]}})
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump({"torch": torch.__version__, "loss": args.loss, "records": records}, f, indent=1)
        os.replace(args.json + ".tmp", args.json)


if __name__ == "__main__":
    sys.exit(main())
