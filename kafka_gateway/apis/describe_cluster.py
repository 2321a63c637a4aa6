"""DescribeCluster (key 60), v0: the live brokers, this one named the controller.

The same brokers as Metadata's (``routing.brokers``): a node alone is the
cluster; in a cluster of gateways over PostgreSQL, every live gateway, on
the listener the request came in on, whichever gateway is asked (as every
broker of a Kafka cluster lists them all). The gateway asked is named the
controller, as in Metadata: there is no controller to send clients to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from kio.schema.errors import ErrorCode

from ..codec import NO_THROTTLE, Request, build, build_response, response_schema
from ..context import HandlerContext
from ..contract import Response
from ..routing import brokers

if TYPE_CHECKING:
    from kio.schema.describe_cluster.v0 import request as v0

    # The request body at each version served: kio generates one class per version.
    DescribeClusterRequest: TypeAlias = v0.DescribeClusterRequest

API_KEY = 60
VERSIONS = (0, 0)


async def handle(broker: HandlerContext, request: Request[DescribeClusterRequest]) -> Response:
    schema = response_schema(API_KEY, request.version)
    return build_response(
        schema.DescribeClusterResponse,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        cluster_id=broker.cluster_id,
        controller_id=broker.node_id,
        brokers=tuple(build(schema.DescribeClusterBroker, broker_id=b.node_id, host=b.host,
                            port=b.port, rack=None) for b in brokers(broker, request)),
    )
