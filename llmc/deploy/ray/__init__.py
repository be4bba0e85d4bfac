"""llmc engines as Ray Serve replicas behind llmc's OpenAI app (the ``[ray]`` extra).

``serve run llmc.deploy.ray:app engine=ENGINE_DIR [num_replicas=2 | min_replicas=1
max_replicas=4 target_ongoing_requests=8] [any llmc serve option=value]`` runs it with Ray's
CLI; ``llmc serve ENGINE --num-replicas N`` (or ``--min-replicas``/``--max-replicas``) with
llmc's. Ray is imported only inside this package.
"""

from llmc.deploy.ray.app import app

__all__ = ["app"]
