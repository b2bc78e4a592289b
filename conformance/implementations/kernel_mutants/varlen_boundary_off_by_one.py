"""Kernel mutant: a packed sequence's keys read one token past its boundary.

Bug: the keys of sequence i are ``cu_seqlens_k[i] .. cu_seqlens_k[i + 1] + 1`` (an inclusive end
where the slice's is exclusive): every sequence but the last also attends to the first key of the
next. Symptom: exact on one sequence; packed with others, each sequence's rows see a key of its
neighbour. Caught by: ``packed`` (and, a batch being packed one sequence per element, the checks
with batch >= 2).
"""

from __future__ import annotations

from conformance.implementations.kernels import Kernel, varlen_kernel_function

CATCHES = "packed"


class VarlenBoundaryOffByOne(Kernel):
    def sequence(self, cu_seqlens, index):
        return slice(int(cu_seqlens[index]), int(cu_seqlens[index + 1]) + 1)


KERNEL = varlen_kernel_function(VarlenBoundaryOffByOne(), "varlen_boundary_off_by_one")
