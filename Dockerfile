# plnt: reconciler, Temporal worker and gateway in one image.
#   docker build -t plnt .
#   docker run --rm -p 8000:8000 -v "$PWD/specs:/specs" plnt up --repo /specs --host 0.0.0.0
# (Binding to 0.0.0.0 exposes the gateway: put it behind your ingress.)
FROM python:3.11-slim

RUN apt-get update \
 && apt-get install -y --no-install-recommends git \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md ./
COPY reconciler ./reconciler
COPY gateway ./gateway
COPY runner ./runner
RUN pip install --no-cache-dir . && useradd --create-home --uid 10001 plnt

USER plnt
WORKDIR /home/plnt
EXPOSE 8000
ENTRYPOINT ["plnt"]
CMD ["--help"]
