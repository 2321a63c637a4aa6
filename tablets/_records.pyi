# The types of the C record walker (tablets/_records.c), for the type checker.
from typing import Any, TypeVar

_H = TypeVar("_H")

class RecordError(ValueError): ...

class RecordWalker:
    def __init__(
        self,
        count: int,
        base_timestamp: int,
        contiguous: bool = ...,
        timestamp_range: tuple[int, int] | None = ...,
        max_errors: int = ...,
        target: int | None = ...,
        min_delta: int = ...,
        collect: bool = ...,
        release_gil: bool = ...,
        require_keys: bool = ...,
        key_seed: bytes | None = ...,
    ) -> None: ...
    # None, or a list of tuples whose shape the constructor's flags choose
    # (collect: (offset delta, timestamp); key_seed: six fields, see _records.c).
    def feed(self, chunk: bytes | memoryview, /) -> Any: ...
    def finish(self) -> None: ...
    @property
    def records(self) -> int: ...
    @property
    def max_timestamp(self) -> int: ...
    @property
    def found(self) -> tuple[int, int] | None: ...
    @property
    def bad_timestamps(self) -> list[tuple[int, int]]: ...
    @property
    def bad_timestamp_count(self) -> int: ...
    @property
    def keyless(self) -> list[int]: ...
    @property
    def keyless_count(self) -> int: ...
    @property
    def position(self) -> int: ...

# check_batch's answers when a check fails (the Python checks then raise).
CHECK_PARSE: int
CHECK_NOT_ONE: int
CHECK_BASE_OFFSET: int
CHECK_TOO_LARGE: int
CHECK_CRC: int
CHECK_COUNT: int
CHECK_CONTROL: int
CHECK_SEQUENCE: int
CHECK_RECORDS: int
INLINE_RECORDS: int

def check_batch(
    records: bytes | memoryview,
    header_type: type[_H],
    max_message_bytes: int,
    segment_bytes: int,
    timestamp_difference_max_ms: int,
    now_ms: int,
    log_append_time: bool,
    require_keys: bool,
    /,
) -> tuple[_H, int | None] | int: ...  # or a CHECK_* code
def stamp(records: bytes | memoryview, size: int, base_offset: int, leader_epoch: int,
          /) -> bytes: ...
def crc32c(data: bytes | memoryview, /) -> int: ...
