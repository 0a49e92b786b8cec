"""The data model and file formats: graphs, clusters, placements, costs, JSON I/O."""
