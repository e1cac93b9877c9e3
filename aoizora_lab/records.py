"""Typed collections that pipeline stages hand each other, each with ``.to_frame()``.

A stage returns frozen values (a pruning decision, a ranked placement, a baseline outcome);
a :class:`Records` holds them in order and turns them into a ``pandas.DataFrame`` for
notebooks, reports and printing. Code downstream reads the values, never the frame: a frame
is for people.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

if TYPE_CHECKING:
    import pandas as pd

T = TypeVar("T")


class Records(Sequence[T], Generic[T]):
    """An immutable sequence of one stage's results. Subclasses name the frame's columns
    (:attr:`COLUMNS`) and how one value becomes a row (:meth:`row`)."""

    COLUMNS: tuple[str, ...] = ()

    def __init__(self, items: Iterable[T] = ()) -> None:
        self._items: tuple[T, ...] = tuple(items)

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> Records[T]: ...
    def __getitem__(self, index: int | slice) -> T | Records[T]:
        if isinstance(index, slice):  # a copy keeps what a subclass stores beside the items
            part = copy.copy(self)
            part._items = self._items[index]
            return part
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[T]:
        return iter(self._items)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} entries)"

    def row(self, item: T) -> dict[str, Any]:
        """One value as a row of :meth:`to_frame`."""
        raise NotImplementedError

    def to_frame(self) -> pd.DataFrame:
        """One row per value, in order, with every column of :attr:`COLUMNS`."""
        import pandas as pd

        return pd.DataFrame([self.row(item) for item in self._items], columns=list(self.COLUMNS))
