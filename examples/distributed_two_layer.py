"""The seed two-layer network trained data-parallel on MPI: `mpiexec -n 2 python
examples/distributed_two_layer.py` (alone, `python examples/distributed_two_layer.py` is a world
of one and trains on the whole batch).

Every rank holds the same weights and its own shard of the batch of 64 (`tr.distributed.shard`);
the traced step sums the ranks' gradients with `all_reduce` -- a node of the compiled step, so the
forward, the backward, the all-reduce and the update are one native call -- and every rank applies
the same update. The loss is summed over the whole batch, so the run takes the same steps as one
process on the whole batch; rank 0 prints the global loss.
"""
import tracer as tr
import tracer.distributed as dist

from two_layer_net import MyReLU, make_data


@tr.trace
def step(x, y, w1, w2, learning_rate):
    loss = (MyReLU.apply(x.mm(w1)).mm(w2) - y).pow(2).sum()
    loss.backward()
    with tr.no_grad():
        dist.all_reduce(w1.grad)  # the gradient of the whole batch's loss
        dist.all_reduce(w2.grad)
        w1.sub_(learning_rate * w1.grad)
        w2.sub_(learning_rate * w2.grad)
        w1.grad.zero_()
        w2.grad.zero_()
        dist.all_reduce(loss)
    return loss


def main(steps: int = 500) -> list[float]:
    dist.init_process_group(backend="mpi")
    x, y, w1, w2 = make_data()  # the same seed on every rank: the same weights and batch
    rows = dist.shard(x.shape[0], shuffle=False)  # this rank's rows of the batch
    x, y = x[rows], y[rows]
    losses = []
    for t in range(1, steps + 1):
        loss = step(x, y, w1, w2, 1e-6)
        losses.append(loss.item())
        if dist.get_rank() == 0 and (t % 100 == 0 or t == 1):
            print(f"Step: {t} : {loss.item():.7g}  ({dist.get_world_size()} ranks)")
    return losses


if __name__ == "__main__":
    main()
