"""Scheduling a matmul kernel (ir/schedule.py's KernelScheduler mixes this method in): a gemm; for
a MatmulUpdate (result = rest + alpha * a @ b), first the loop that stores `rest` (the result's
expression with the product taken as 0) -- skipped when rest is the parameter whose buffer the
result is written into -- then the gemm adds alpha * a @ b.

A gemm that threads may split has its products cut into blocks of rows or of columns
(ir/schedule_threads.gemm_blocks). An update's rest is then stored by each task on the rows of its
own block, just before it adds that block of the product, so that the blocks still run on threads
(an SGD step whose .grad was already set, w - lr * (w.grad + x^T @ d), is such an update). Only a
rest that the flat loop stores, beside blocks of rows, is cut so; any other is stored over the
whole result first, and the kernel runs on one thread."""
from __future__ import annotations

from tracer.ir.fusion import Kernel, matmul_operand
from tracer.ir.loops import Gemm, literal
from tracer.ir.memory import MemoryPlan
from tracer.ir.schedule_threads import gemm_blocks


def scheduled_part(kernel: Kernel) -> Kernel:
    """What the scheduler of a matmul kernel evaluates: the kernel itself, or for a MatmulUpdate
    the loop kernel of its rest."""
    if kernel.update is None:
        return kernel
    matmul = kernel.update.matmul
    skipped = {id(matmul), *(id(v.producer) for v in matmul.inputs if matmul_operand(v)[1])}
    instructions = [i for i in kernel.instructions if id(i) not in skipped]
    read = {id(x) for i in instructions for x in i.inputs}
    return Kernel("loop", list(kernel.results), instructions,
                  [v for v in kernel.inputs if id(v) in read])


class MatmulKernels:
    def matmul_kernel(self, kernel: Kernel, output: str, plan: MemoryPlan, threads: int,
                      own_gemm: bool = False) -> int:
        """The statements of the matmul `kernel` (this scheduler's kernel is its
        `scheduled_part`), whose result goes into the buffer named `output`; returns how many
        blocks each product is cut into."""
        update = kernel.update
        matmul = kernel.instructions[-1] if update is None else update.matmul
        (a, transpose_a), (b, transpose_b) = map(matmul_operand, matmul.inputs)
        m, k = matmul.inputs[0].shape[-2:]
        n = matmul.inputs[1].shape[-1]
        (result,) = kernel.results
        dtype = result.dtype
        blocks, rows, columns = gemm_blocks(kernel, threads, own_gemm)
        alpha = literal(1, dtype)
        if update is not None:
            self.zeros.add(id(matmul.outputs[0]))
            for factor in update.factors:  # evaluated first: they come before the loop and gemm
                value = self.evaluate(factor, ())
                alpha = value if alpha == literal(1, dtype) else self.compute(
                    "mul", [alpha, value], [dtype, dtype], dtype)
            if update.sign < 0:
                alpha = self.compute("neg", [alpha], [dtype], dtype)
            in_place = update.rest_is is not None and plan.write(result) == plan.read(update.rest_is)
            if not in_place and blocks > 1 and columns == n and self.flat:
                counter = self.open_task_elements(blocks, rows * n, m * n)
                self.store_results((counter,), (result.type.size,), [output])
                self.close_loop()
            elif not in_place:  # over the whole result: the kernel runs on one thread
                self.loop_kernel([output], split=False)
                blocks, rows, columns = 1, m, n
        self.emit(Gemm(self.buffers[id(a)], self.buffers[id(b)], output, result, m, n, k,
                       transpose_a, transpose_b, dtype, accumulate=update is not None,
                       alpha=alpha, line=matmul.location, blocks=blocks, rows=rows,
                       columns=columns))
        return blocks
