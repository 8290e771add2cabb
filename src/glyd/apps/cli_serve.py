"""``glyd serve MODEL``: the command line of :mod:`glyd.apps.serve`."""

from __future__ import annotations

import argparse

from glyd.apps.cli_models import add_memory_limit, device_arg, limit_option, path_arg
from glyd.apps.layouts import layout_names
from glyd.errors import GlydError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API, with a chat page at /",
        description="Serve a packed model (or a bf16 folder, packed as it loads) over an OpenAI-compatible API: "
        "/v1/chat/completions (streaming or not), /v1/completions and /v1/models, with continuous batching "
        "(transformers' serving code); / is a chat page that shows the layout, the bytes and tokens/s. Sampling is "
        "the server's (--temperature, --top-p): a request that asks for other values gets a 400.",
    )
    p.add_argument("model", type=path_arg,
                   help="a packed folder (glyd pack / save_pretrained) or a bf16 transformers folder")
    p.add_argument("--name", help="the model name clients send and /v1/models lists (default: MODEL as given)")
    p.add_argument("--layout", default="auto", choices=layout_names(auto=True),
                   help="layout a bf16 folder is packed with as it loads (default auto; a packed folder keeps its own)")
    add_memory_limit(p)
    p.add_argument("--kv", choices=("lossless", "lossless-tiered", "lossless-dense"), default=None,
                   help="keep the KV cache in glyd's lossless page code: kvf12, or kvtiered with lossless-tiered "
                   "(lossless-dense: its old name); requests then run one at a time")
    p.add_argument("--device", default=None, type=device_arg, help="cpu or cuda[:N] (default: cuda when available)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0 takes a free one)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature of every request (default 0: "
                   "greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling of every request (default 1)")
    p.add_argument("--max-tokens", type=int, default=256, help="new tokens of a request that gives no max_tokens "
                   "(default 256)")
    p.add_argument("--block-size", type=int, help="tokens a block of the batching KV cache (default: transformers' "
                   "on a GPU, 32 on a CPU)")
    p.add_argument("--num-blocks", type=int, help="blocks of the batching KV cache (default: sized from GPU memory; "
                   "64 on a CPU)")
    p.add_argument("--max-batch-tokens", type=int, help="tokens one batching step may hold (default: transformers'; "
                   "256 on a CPU)")
    p.add_argument("--cuda-graphs", choices=("auto", "on", "off"), default="auto",
                   help="replay continuous batching's steps from CUDA graphs (default auto: transformers' choice, "
                   "graphs only where the attention needs no mask)")
    p.set_defaults(func=limit_option(_serve))


def config_from_args(args: argparse.Namespace):
    """The :class:`~glyd.apps.serve.ServeConfig` of parsed ``glyd serve`` arguments."""
    from glyd.apps.serve import ServeConfig

    try:
        return ServeConfig(model=args.model, name=args.name, layout=args.layout, kv=args.kv, device=args.device,
                           host=args.host, port=args.port, temperature=args.temperature, top_p=args.top_p,
                           max_tokens=args.max_tokens, block_size=args.block_size, num_blocks=args.num_blocks,
                           max_batch_tokens=args.max_batch_tokens, memory_limit=args.memory_limit,
                           cuda_graphs={"auto": None, "on": True, "off": False}[args.cuda_graphs])
    except ValueError as exc:
        raise GlydError(f"{exc}") from None


def _serve(args: argparse.Namespace) -> int:
    from glyd.apps.serve import Server

    server = Server(config_from_args(args))
    cfg, info = server.config, server.info
    host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    print(f"glyd serve: {info['id']} ({info['layout']}, {info['weight_bytes'] / 2**20:.1f} MiB of weights, "
          f"KV cache {info['kv']}, {info['batching']} batching) on "
          f"{f'http://{host}:{cfg.port}' if cfg.port else 'a free port (logged below)'}: chat page at /, "
          f"OpenAI API at /v1", flush=True)
    server.run()
    return 0
