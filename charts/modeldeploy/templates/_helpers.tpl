{{/* Names and labels. */}}
{{- define "modeldeploy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "modeldeploy.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "modeldeploy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "modeldeploy.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "modeldeploy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "modeldeploy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "modeldeploy.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "modeldeploy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: modeldeploy
{{- end -}}

{{- define "modeldeploy.image" -}}
{{- printf "%s:%s" .Values.image.repository (toString .Values.image.tag) -}}
{{- end -}}

{{/* The peering object's name: the release's, so two releases never share one. */}}
{{- define "modeldeploy.peeringName" -}}
{{- include "modeldeploy.fullname" . -}}
{{- end -}}

{{/* The namespaces the operator watches, as a JSON list: [] in cluster mode (rbac.clusterWide), else
watchNamespaces, or the release's own namespace when that list is empty (the default). */}}
{{- define "modeldeploy.watched" -}}
{{- if .Values.rbac.clusterWide -}}
[]
{{- else if .Values.watchNamespaces -}}
{{- toJson .Values.watchNamespaces -}}
{{- else -}}
{{- toJson (list .Release.Namespace) -}}
{{- end -}}
{{- end -}}

{{/* Checks that no schema can express. */}}
{{- define "modeldeploy.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.operator.peering.enabled) -}}
{{- fail "replicaCount > 1 needs operator.peering.enabled: without peering every replica would act" -}}
{{- end -}}
{{- if and .Values.rbac.clusterWide .Values.watchNamespaces -}}
{{- fail "rbac.clusterWide=true manages every namespace: leave watchNamespaces empty (or set rbac.clusterWide=false)" -}}
{{- end -}}
{{- if and .Values.networkPolicy.enabled .Values.rbac.clusterWide (not .Values.networkPolicy.namespaces) -}}
{{- fail "networkPolicy.enabled in cluster mode (rbac.clusterWide=true) needs networkPolicy.namespaces: the chart cannot know which namespaces hold ModelDeployments" -}}
{{- end -}}
{{- if ne (len .Values.watchNamespaces) (len (uniq .Values.watchNamespaces)) -}}
{{- fail "watchNamespaces has duplicates" -}}
{{- end -}}
{{- end -}}

{{/*
Rules the operator needs inside every namespace it watches (a ClusterRole in cluster mode, a Role per
watched namespace in namespaced mode). Derived from operator/modeldeploy (reconciler.py, operator.py,
controller.py, kube.py) and from kopf's watches; nothing else is called. No Secrets, ConfigMaps, exec.
*/}}
{{- define "modeldeploy.namespacedRules" -}}
# ModelDeployments: kopf lists and watches them (@kopf.on.event); the reconciler GETs each one and
# merge-patches away a handled modeldeploy.io/command annotation (kubectl modeldeploy promote/abort/
# rollback). Nothing else is written on them: only event handlers, so kopf adds no finalizer, progress or
# diff-base annotations. No update, no delete.
- apiGroups: [modeldeploy.io]
  resources: [modeldeployments]
  verbs: [get, list, watch, patch]
# Status: the reconciler merge-patches .status (with resourceVersion).
- apiGroups: [modeldeploy.io]
  resources: [modeldeployments/status]
  verbs: [patch]
# Children, one Deployment per revision: kopf watches them (label-filtered), the reconciler lists them,
# GETs one it is about to create (an object of that name that is not its own is left alone:
# NameConflict), server-side applies them (a PATCH that may create: both create and patch) and deletes
# old revisions.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
# Children: the model's Service and per-revision Services; same calls as Deployments.
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch, delete]
# Children: the model's PodDisruptionBudget; same calls as Deployments.
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, delete]
# Serving pods: watched and listed for readiness, per-revision counts and scheduling failures; patched
# for the modeldeploy.io/shadow annotation (where a pod copies a sample of its requests: shadow stage).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, patch]
# The modeldeploy.io/in-traffic readiness gate: a strategic-merge patch of the pod's status conditions.
- apiGroups: [""]
  resources: [pods/status]
  verbs: [patch]
# Events about ModelDeployments, posted by the reconciler (core/v1 only; kopf's event posting is off);
# patch: a repeat raises the first Event's count (client-go's aggregation)
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
{{- if .Values.rbac.gatewayAPI }}
# Gateway API traffic routing (rollout.trafficRouting.mode gatewayAPI): kopf watches the HTTPRoutes
# (label-filtered, so an edited or deleted route is repaired at once), the reconciler lists the
# ModelDeployment's HTTPRoute, server-side applies its weights and deletes it when routing changes.
- apiGroups: [gateway.networking.k8s.io]
  resources: [httproutes]
  verbs: [get, list, watch, create, patch, delete]
# ... and reads the EndpointSlices of its revision Services (label-filtered watch): a route weights a
# canary only once the gateway can know one of its endpoints is ready (no 503 from an empty backend).
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
{{- end }}
{{- if .Values.rbac.keda }}
# spec.autoscaling: the reconciler lists, server-side applies and deletes the ModelDeployment's KEDA
# ScaledObject (KEDA's own HPA then writes spec.replicas through the scale subresource).
- apiGroups: [keda.sh]
  resources: [scaledobjects]
  verbs: [get, list, create, patch, delete]
{{- end }}
{{- end -}}

{{/* kopf's peering object: kopf watches it and patches its status (keep-alives); the operator's peering
gate GETs it. The chart creates it, so there is no create. */}}
{{- define "modeldeploy.peeringRule" -}}
# Our peering object only: read by the operator's peering gate, keep-alives patched in by kopf.
- apiGroups: [kopf.dev]
  resources: [{{ .resource }}]
  resourceNames: [{{ .name | quote }}]
  verbs: [get, patch]
# list/watch cannot be limited by resourceNames in RBAC unless the request names the object: kopf's
# watch is on the whole collection.
- apiGroups: [kopf.dev]
  resources: [{{ .resource }}]
  verbs: [list, watch]
{{- end -}}
