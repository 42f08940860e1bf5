"""Data-parallel training in four stages, each a sibling class with the same interface:

    naive.DDPNaive                 all-reduce every gradient after backward
    flat.DDPFlat                   one all-reduce over all gradients flattened together
    overlap.DDPOverlapIndividual   all-reduce each gradient from its hook, as backward produces it
    bucketed.DDPBucketed           gradients grouped into buckets, one async all-reduce per bucket

Usage (every stage): wrap, then per step
    model = DDPBucketed(module, bucket_size_mb=25)    # broadcasts rank 0's weights and buffers
    model.on_train_batch_start(); opt.zero_grad(set_to_none=True)
    loss_fn(model(x_shard), y_shard).backward()
    model.finish_gradient_synchronization()          # grads are now averaged over ranks
    opt.step()
"""

from .bucketed import DDPBucketed
from .common import DataParallel
from .flat import DDPFlat
from .naive import DDPNaive
from .overlap import DDPOverlapIndividual

STAGES: dict[str, type[DataParallel]] = {
    "naive": DDPNaive,
    "flat": DDPFlat,
    "overlap": DDPOverlapIndividual,
    "bucketed": DDPBucketed,
}

__all__ = ["STAGES", "DDPBucketed", "DDPFlat", "DDPNaive", "DDPOverlapIndividual", "DataParallel"]
