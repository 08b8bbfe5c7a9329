"""The module the ``feast`` CLI loads: shopstream's Feast objects, at module level.

The definitions themselves are built in :func:`pipelines.feast_store.build_definitions`
(from the snapshot paths, which come from settings), so the CLI and
``pipelines.feast_store.feature_store(settings)`` register exactly the same objects.
"""

from pipelines.feast_store import definitions_for
from pipelines.settings import Settings

_definitions = definitions_for(Settings())

user = _definitions.user
item = _definitions.item
user_activity_snapshots = _definitions.user_source
item_stats_snapshots = _definitions.item_source
user_activity_push = _definitions.user_push
item_stats_push = _definitions.item_push
user_activity = _definitions.user_activity
item_stats = _definitions.item_stats
ranking_v1 = _definitions.ranking_v1
