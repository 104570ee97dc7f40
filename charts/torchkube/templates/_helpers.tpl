{{/*
Names, labels and the derived settings every template shares. Nothing else in the chart builds
a name or an app.kubernetes.io/* label.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "torchkube.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The base name of every resource: fullnameOverride, else the release name, with the chart name
appended unless the release name already contains it ("torchkube" for a release "torchkube").
*/}}
{{- define "torchkube.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* name-version, for the helm.sh/chart label. */}}
{{- define "torchkube.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object of the release. */}}
{{- define "torchkube.labels" -}}
helm.sh/chart: {{ include "torchkube.chart" . }}
{{ include "torchkube.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: torchkube
{{- end }}

{{/* Labels that select the operator pods (Deployment selector, Service, PodMonitor). */}}
{{- define "torchkube.selectorLabels" -}}
app.kubernetes.io/name: {{ include "torchkube.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The ServiceAccount the operator runs as. */}}
{{- define "torchkube.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "torchkube.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "torchkube.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The namespaces the operator watches, as a JSON list (use with fromJsonArray): watchNamespaces,
or in namespace scope the release namespace when the list is empty. An empty list means the
whole cluster.
*/}}
{{- define "torchkube.watchNamespaces" -}}
{{- $namespaces := .Values.watchNamespaces | default list }}
{{- if and (eq .Values.rbac.scope "namespace") (not $namespaces) }}
{{- $namespaces = list .Release.Namespace }}
{{- end }}
{{- toJson (uniq $namespaces) }}
{{- end }}

{{/* "true" when Lease-based leader election is on: more than one replica, or asked for. */}}
{{- define "torchkube.leaderElection" -}}
{{- if or .Values.leaderElection.enabled (gt (int .Values.replicaCount) 1) }}true{{- end }}
{{- end }}

{{/* The name of the Lease the replicas compete for (in the release namespace). */}}
{{- define "torchkube.leaseName" -}}
{{- default (include "torchkube.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{/*
The rules the operator needs in each namespace it watches: read and delete its jobs (a finished
job's TTL), write their status, run their pods, create their Services, checkpoint claim and
events. The jobs and pods are read through watches (kopf's and the operator's own pod watch);
kopf never patches them (no finalizers).
*/}}
{{- define "torchkube.namespacedRules" -}}
- apiGroups: [torchkube.io]
  resources: [trainingjobs]
  verbs: [get, list, watch, delete]
- apiGroups: [torchkube.io]
  resources: [trainingjobs/status]
  verbs: [patch]
# Children carry blockOwnerDeletion; with the OwnerReferencesPermissionEnforcement admission
# plugin that needs update on the owner's finalizers.
- apiGroups: [torchkube.io]
  resources: [trainingjobs/finalizers]
  verbs: [update]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete, patch]
# Watched (label-selected) so a deleted Service or claim is recreated and a namesake's is
# never taken for the job's own; patched to repair a Service's selector.
- apiGroups: [""]
  resources: [services, persistentvolumeclaims]
  verbs: [get, list, watch, create, patch]
# Repeated events are aggregated: a count bump is a patch.
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
{{- if .Values.kueue.enabled }}
# Kueue (docs/queueing.md): a job with a queue-name label is admitted through a Workload the
# operator creates, follows, updates (quota given back, Finished) and releases at deletion.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, list, watch, create, patch]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [patch]
# Its place in line, from Kueue's visibility API (an aggregated API; optional: without it the
# job waits without a position).
- apiGroups: [visibility.kueue.x-k8s.io]
  resources: [localqueues/pendingworkloads]
  verbs: [get]
{{- end }}
{{- end }}
