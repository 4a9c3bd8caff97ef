"""`python -m benchmarks.gpu`: a GPU verdict in about eight minutes (see `__main__` for the command line).

Four contenders (a plain torch loop, torch DDP at world size 1, Lightning `ddp`, ours), eager and
`torch.compile`d, on a GPT-2-small-shaped model, a ResNet-50-shaped CNN and the small launch-bound
GPT, each contender in its own persistent process, taking turns on the one GPU.
"""
