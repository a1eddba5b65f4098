"""The torch patch: nn.DataParallel and torch.distributed (DDP, gloo with device tensors staged
through the host) on DirectML adapters."""
