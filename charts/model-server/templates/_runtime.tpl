{{/*
The runtime switch: the server container's image, command, args, environment and health path for
runtime.type, as JSON ({image, command, args, env, healthPath}). Every runtime serves
/models/<model.name> on 0.0.0.0:8000 under the name deployment.name, with runtime.contextLength
tokens of context; runtime.args come last. The server CLIs, as each project documents them:

  llama.cpp  /app/llama-server --model FILE.gguf --alias NAME --host 0.0.0.0 --port 8000 --ctx-size N
             [--threads T] [--n-gpu-layers 999 when it has GPUs]
  vllm       vllm serve DIR --served-model-name NAME --host 0.0.0.0 --port 8000 --max-model-len N
             [--tensor-parallel-size G when G > 1]
  tgi        text-generation-launcher --model-id DIR --hostname 0.0.0.0 --port 8000
             --max-input-tokens N-1 --max-total-tokens N [--num-shard G when G > 1]
             (TGI has no served-name option: its Messages API accepts any `model`)
  sglang     python3 -m sglang.launch_server --model-path DIR --served-model-name NAME --host 0.0.0.0
             --port 8000 --context-length N [--tp-size G when G > 1]

Health (startup, readiness and liveness probes): GET /health on each of them. llama.cpp answers 503
while it loads the model, 200 when it serves; vLLM, TGI and SGLang answer 200 once their engine is up.

The flags the chart sets are refused in runtime.args (an argparse-style "last one wins" would let
them silently override what plnt routes to and smoke-tests).
*/}}
{{- define "model-server.runtime" -}}
{{- $rt := .Values.runtime -}}
{{- $type := $rt.type -}}
{{- $name := .Values.deployment.name -}}
{{- $dir := printf "/models/%s" .Values.model.name -}}
{{- $context := int $rt.contextLength -}}
{{- $gpus := int .Values.gpu.count -}}
{{- $images := $rt.images -}}
{{- $command := list -}}
{{- $args := list -}}
{{- $image := "" -}}
{{- $env := list -}}
{{- $reserved := list -}}
{{- $health := "" -}}
{{- if eq $type "llama.cpp" -}}
  {{- $image = ternary $images.llamaCppCuda $images.llamaCpp (gt $gpus 0) -}}
  {{- $command = list "/app/llama-server" -}}
  {{- $args = list "--model" (printf "%s/%s" $dir $rt.modelFile) "--alias" $name "--host" "0.0.0.0" "--port" "8000" "--ctx-size" (toString $context) -}}
  {{- with $rt.threads -}}
    {{- $args = concat $args (list "--threads" (toString (int .))) -}}
  {{- end -}}
  {{- if gt $gpus 0 -}}
    {{- $args = concat $args (list "--n-gpu-layers" "999") -}}
  {{- end -}}
  {{- $health = "/health" -}}
  {{- $reserved = list "-m" "--model" "-a" "--alias" "--host" "--port" "-c" "--ctx-size" "-t" "--threads" -}}
{{- else if eq $type "vllm" -}}
  {{- $image = $images.vllm -}}
  {{- $command = list "vllm" "serve" -}}
  {{- $args = list $dir "--served-model-name" $name "--host" "0.0.0.0" "--port" "8000" "--max-model-len" (toString $context) -}}
  {{- if gt $gpus 1 -}}
    {{- $args = concat $args (list "--tensor-parallel-size" (toString $gpus)) -}}
  {{- end -}}
  {{- $env = list (dict "name" "VLLM_NO_USAGE_STATS" "value" "1") -}}
  {{- $health = "/health" -}}
  {{- $reserved = list "--model" "--served-model-name" "--host" "--port" "--max-model-len" "-tp" "--tensor-parallel-size" -}}
{{- else if eq $type "tgi" -}}
  {{- $image = $images.tgi -}}
  {{- $command = list "text-generation-launcher" -}}
  {{- /* --hostname explicitly: the launcher reads HOSTNAME from the environment, which Kubernetes sets to the pod's name. */ -}}
  {{- $args = list "--model-id" $dir "--hostname" "0.0.0.0" "--port" "8000" "--max-input-tokens" (toString (sub $context 1)) "--max-total-tokens" (toString $context) -}}
  {{- if gt $gpus 1 -}}
    {{- $args = concat $args (list "--num-shard" (toString $gpus)) -}}
  {{- end -}}
  {{- $env = list (dict "name" "USAGE_STATS" "value" "off") (dict "name" "HUGGINGFACE_HUB_CACHE" "value" "/cache/huggingface/hub") -}}
  {{- $health = "/health" -}}
  {{- $reserved = list "--model-id" "--hostname" "-p" "--port" "--max-input-tokens" "--max-input-length" "--max-total-tokens" "--num-shard" -}}
{{- else if eq $type "sglang" -}}
  {{- $image = $images.sglang -}}
  {{- $command = list "python3" "-m" "sglang.launch_server" -}}
  {{- $args = list "--model-path" $dir "--served-model-name" $name "--host" "0.0.0.0" "--port" "8000" "--context-length" (toString $context) -}}
  {{- if gt $gpus 1 -}}
    {{- $args = concat $args (list "--tp-size" (toString $gpus)) -}}
  {{- end -}}
  {{- $health = "/health" -}}
  {{- $reserved = list "--model-path" "--model" "--served-model-name" "--host" "--port" "--context-length" "--tp" "--tp-size" -}}
{{- else -}}
  {{- fail (printf "runtime.type %q: one of llama.cpp, vllm, tgi, sglang" $type) -}}
{{- end -}}
{{- range ($rt.args | default list) -}}
  {{- $flag := regexReplaceAll "=.*$" (toString .) "" -}}
  {{- if has $flag $reserved -}}
    {{- fail (printf "runtime.args: %s is set by the chart for %s (what it serves, where it listens, its context and GPUs come from the ModelDeployment's spec); remove it" $flag $type) -}}
  {{- end -}}
{{- end -}}
{{- $args = concat $args ($rt.args | default list) -}}
{{- toJson (dict "image" ($rt.image | default $image) "command" $command "args" $args "env" $env "healthPath" $health) -}}
{{- end -}}
