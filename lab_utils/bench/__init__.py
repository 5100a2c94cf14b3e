"""Lab 09: benchmarking a server (sweeps, goodput, the knee, coordinated omission, Little's law),
scaling signals, an autoscaler tested on traces, and Kubernetes / KEDA manifests validated offline.

- `load`: sweeps with the course load generator, percentiles, goodput, knee, Little's law;
- `autoscale`: a fast fluid simulator of N replicas behind a load balancer, reference policies;
- `crosscheck`: vLLM's own serving benchmark on the same workload; GuideLLM's install check;
- `manifests`: offline validation of docker/k8s (kubernetes-validate, KEDA's schema), metric names.
"""
