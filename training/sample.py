"""Small synthetic event sets for tests, demos and the notebook (seconds, not minutes).

:func:`sample_events` draws a store where users have favourite categories (so a
personal model has something to learn over popularity) and items follow a Zipf
law inside their category, with views, add-to-carts and purchases in the event
contract's columns. :func:`write_offline_events` lays such a frame out exactly as
the offline store does (``events/event_date=.../event_hour=.../*.parquet``), with
pyarrow, so a test can train "from the offline store" without running the stream.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["sample_events", "write_offline_events"]


def sample_events(
    *,
    users: int = 300,
    items: int = 120,
    categories: int = 8,
    events: int = 12_000,
    days: float = 14.0,
    start: str = "2026-10-01T00:00:00Z",
    favourites: int = 2,
    affinity: float = 0.85,
    seed: int = 7,
) -> pd.DataFrame:
    """Events with the contract's columns, sorted by time.

    Each user picks ``favourites`` categories that get ``affinity`` of her views;
    an item's chance inside its category is Zipf-like; 10 % of views go to the cart
    and a third of those are bought.
    """
    rng = np.random.default_rng(seed)
    item_cat = rng.integers(0, categories, size=items)
    item_pop = 1.0 / np.arange(1, items + 1) ** 1.0
    rng.shuffle(item_pop)
    user_fav = np.stack([rng.choice(categories, size=favourites, replace=False) for _ in range(users)])
    user_activity = 1.0 / np.arange(1, users + 1) ** 0.6
    user_activity /= user_activity.sum()
    regions = np.array(["United Kingdom", "Germany", "France", "Spain"])
    user_region = rng.choice(len(regions), size=users, p=[0.5, 0.2, 0.2, 0.1])
    by_cat = [np.flatnonzero(item_cat == c) for c in range(categories)]
    by_cat_p = [item_pop[ix] / item_pop[ix].sum() if len(ix) else ix for ix in by_cat]
    n_views = int(events / 1.13)
    who = rng.choice(users, size=n_views, p=user_activity)
    fav_pick = rng.random(n_views) < affinity
    cat = np.where(fav_pick, user_fav[who, rng.integers(0, favourites, size=n_views)],
                   rng.integers(0, categories, size=n_views))
    item = np.empty(n_views, dtype=np.int64)
    for c in range(categories):
        rows = np.flatnonzero(cat == c)
        if len(by_cat[c]) == 0:
            item[rows] = rng.integers(0, items, size=len(rows))
        else:
            item[rows] = rng.choice(by_cat[c], size=len(rows), p=by_cat_p[c])
    t0 = pd.Timestamp(start)
    t0 = t0.tz_localize("UTC") if t0.tzinfo is None else t0.tz_convert("UTC")
    seconds = np.sort(rng.uniform(0, days * 86400.0, size=n_views))
    views = pd.DataFrame({"u": who, "i": item, "s": seconds, "t": "view"})
    carts = views[rng.random(n_views) < 0.10].assign(t="add_to_cart")
    carts["s"] = carts["s"] + 30.0
    buys = carts[rng.random(len(carts)) < 0.33].assign(t="purchase")
    buys["s"] = buys["s"] + 300.0
    frame = pd.concat([views, carts, buys], ignore_index=True).sort_values("s", kind="stable")
    frame = frame[frame["s"] < days * 86400.0].reset_index(drop=True)
    n = len(frame)
    price = np.round(5.0 + (frame["i"].to_numpy() % 17) * 3.0, 2) - 0.01
    return pd.DataFrame({
        "event_id": [f"e{seed}-{k:08d}" for k in range(n)],
        "event_type": frame["t"].to_numpy(),
        "event_time": t0 + pd.to_timedelta(frame["s"].to_numpy(), unit="s"),
        "user_id": [f"u{u:05d}" for u in frame["u"].to_numpy()],
        "session_id": [f"s{u:05d}-{int(s // 3600)}" for u, s in zip(frame["u"].to_numpy(), frame["s"].to_numpy(), strict=True)],
        "item_id": [f"i{i:05d}" for i in frame["i"].to_numpy()],
        "category_id": [f"c{c:03d}" for c in item_cat[frame["i"].to_numpy()]],
        "region": regions[user_region[frame["u"].to_numpy()]],
        "price": price,
        "quantity": np.ones(n, dtype=np.int32),
        "device": "desktop",
    })


def write_offline_events(frame: pd.DataFrame, events_path: str | Path) -> list[str]:
    """Write events in the offline store's layout (hive partitions by UTC date and hour).

    Returns the files written. Timestamps are stored as UTC microseconds, as the
    stream writes them.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(events_path)
    times = pd.to_datetime(frame["event_time"], utc=True)
    data = frame.assign(event_time=times.astype("datetime64[us, UTC]"))
    written: list[str] = []
    for (day, hour), part in data.groupby([times.dt.strftime("%Y-%m-%d"), times.dt.hour], sort=True):
        folder = root / f"event_date={day}" / f"event_hour={hour}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"part-{len(written):05d}.parquet"
        pq.write_table(pa.Table.from_pandas(part.reset_index(drop=True), preserve_index=False), path)
        written.append(str(path))
    return written
