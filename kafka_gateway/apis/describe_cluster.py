"""DescribeCluster (key 60), v0: this node is the cluster and its controller."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode

from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response

if TYPE_CHECKING:
    from kio.schema.describe_cluster.v0 import request as v0

    # The request body at each version served: kio generates one class per version.
    DescribeClusterRequest: TypeAlias = v0.DescribeClusterRequest

API_KEY = 60
VERSIONS = (0, 0)


async def handle(broker: HandlerContext, request: Request[DescribeClusterRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)
    host, port = broker.advertised(request)
    return build_response(
        schema.DescribeClusterResponse,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        cluster_id=broker.cluster_id,
        controller_id=broker.node_id,
        brokers=(build(schema.DescribeClusterBroker, broker_id=broker.node_id, host=host,
                       port=port, rack=None),),
    )
