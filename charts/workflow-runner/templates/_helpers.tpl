{{/*
Every object is named after the release: plnt installs `<workflow>` (stable) and
`<workflow>-canary` (canary), so both tracks of one workflow coexist in one namespace.
*/}}
{{- define "workflow-runner.fullname" -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" .Release.Name) -}}
{{- fail (printf "release name %q must be a DNS-1035 label (it names a Service)" .Release.Name) -}}
{{- end -}}
{{- if gt (len .Release.Name) 53 -}}
{{- fail (printf "release name %q is longer than 53 characters" .Release.Name) -}}
{{- end -}}
{{- .Release.Name -}}
{{- end -}}

{{/* A recipe version as a label value: `+` is not allowed there, and values end alphanumeric. */}}
{{- define "workflow-runner.versionLabel" -}}
{{- $v := .Values.workflow.version | replace "+" "_" | trunc 63 -}}
{{- regexReplaceAll "[^A-Za-z0-9]+$" $v "" -}}
{{- end -}}

{{/* The selector: never changes for a release (Deployment selectors are immutable). */}}
{{- define "workflow-runner.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
plnt.work/workflow: {{ .Values.workflow.name }}
plnt.work/track: {{ .Values.track }}
{{- end -}}

{{- define "workflow-runner.labels" -}}
{{ include "workflow-runner.selectorLabels" . }}
app.kubernetes.io/version: {{ include "workflow-runner.versionLabel" . | quote }}
app.kubernetes.io/component: runner
app.kubernetes.io/part-of: plnt
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
plnt.work/workflow-namespace: {{ .Values.workflow.namespace }}
{{- end -}}

{{/* "true" when an HPA owns the replica count. */}}
{{- define "workflow-runner.autoscaled" -}}
{{- $scaling := .Values.autoscaling | default dict -}}
{{- if or $scaling.targetInFlight $scaling.targetInvocationsPerSecond -}}true{{- end -}}
{{- end -}}

{{/* "true" when a KEDA ScaledObject, not the chart's own HPA, scales the release (autoscaling.autoscaler). */}}
{{- define "workflow-runner.keda" -}}
{{- if and (include "workflow-runner.autoscaled" .) (eq ((.Values.autoscaling | default dict).autoscaler | default "hpa") "keda") -}}true{{- end -}}
{{- end -}}

{{/*
The PromQL label matchers of this release's pods' series: their namespace and pod name (a Deployment's
pods are <release>-<pod-template-hash>-<suffix>, so the canary's <release>-canary-... pods never match
the stable release's), the two labels a Prometheus scraping pods gives each series (kube-prometheus'
PodMonitor, the prometheus chart's kubernetes-pods job).
*/}}
{{- define "workflow-runner.podSeries" -}}
namespace="{{ .Release.Namespace }}",pod=~"{{ include "workflow-runner.fullname" . }}-[a-z0-9]+-[a-z0-9]+"
{{- end -}}

{{- define "workflow-runner.checkReplicas" -}}
{{- if lt (int .Values.replicas.max) (int .Values.replicas.min) -}}
{{- fail (printf "replicas.max (%v) must be >= replicas.min (%v)" .Values.replicas.max .Values.replicas.min) -}}
{{- end -}}
{{- end -}}

{{- define "workflow-runner.trustConfigMap" -}}
{{ include "workflow-runner.fullname" . }}-recipe-trust
{{- end -}}

{{/*
The trustedRootFile paths, sorted, as a JSON list (ConfigMap key trusted-root-<index>.json). Each is
mounted at its own path beside policies.yaml, where `plnt recipe fetch` looks for it.
*/}}
{{- define "workflow-runner.trustedRootPaths" -}}
{{- $paths := keys (.Values.recipeFetch.trustedRoots | default dict) | sortAlpha -}}
{{- range $paths -}}
{{- if or (hasPrefix "/" .) (regexMatch "(^|/)\\.\\.?(/|$)" .) (eq . "policies.yaml") -}}
{{- fail (printf "recipeFetch.trustedRoots: %q must be a relative path without . or .. segments, other than policies.yaml" .) -}}
{{- end -}}
{{- end -}}
{{- toJson $paths -}}
{{- end -}}

{{/* Which registry kind the recipe comes from: s3 or oci (a pod reaches no file: registry). */}}
{{- define "workflow-runner.registryKind" -}}
{{- $registry := .Values.workflow.registry -}}
{{- if hasPrefix "s3://" $registry -}}s3
{{- else if hasPrefix "oci" $registry -}}oci
{{- else -}}
{{- fail (printf "workflow.registry %q: a runner pod fetches its recipe itself and reaches only s3:// or oci:// registries" $registry) -}}
{{- end -}}
{{- end -}}

{{/* Every container and init container: the `restricted` Pod Security Standard, stated per container. */}}
{{- define "workflow-runner.containerSecurity" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}
