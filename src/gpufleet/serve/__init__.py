"""Multi-tenant LoRA serving (Punica): one base model, many adapters batched into the same forward pass.

``ops`` holds the batched LoRA operators (SGMV / BGMV: PyTorch reference, Triton on the GPU), ``model`` a
Llama-architecture model whose projections add per-request LoRA deltas, ``engine`` continuous batching with a
paged KV cache and an adapter cache, ``server`` the OpenAI-compatible HTTP front end and ``placement`` Punica's
cluster scheduler. torch, triton, fastapi and uvicorn are the ``gpufleet[serve]`` extra, imported lazily.
"""
