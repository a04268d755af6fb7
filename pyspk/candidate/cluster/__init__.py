"""The cluster area: scipy's Euclidean `pdist` and its centroid and median `linkage` on
the GPU, bit for bit (the cluster module, `ptx/src/cluster/cluster.cu`), as plans on a
`CudaRuntime`; `DeviceLinkage` runs both for host points. Needs no PyTorch."""

from pyspk.candidate.cluster.plan import (
    MAX_POINTS,
    METHODS,
    DeviceLinkage,
    LinkagePlan,
    PdistPlan,
    plan_linkage,
    plan_pdist,
    points_of,
)

__all__ = [
    "MAX_POINTS",
    "METHODS",
    "DeviceLinkage",
    "LinkagePlan",
    "PdistPlan",
    "plan_linkage",
    "plan_pdist",
    "points_of",
]
