{{/* Full name of the hub objects. */}}
{{- define "ocmfl.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ocmfl.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: hub-controller
{{- end -}}

{{- define "ocmfl.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ocm-federated-learning
{{- end -}}

{{- define "ocmfl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ocmfl.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The signer part: its Deployment and ServiceAccount (the only holder of the CA keys). */}}
{{- define "ocmfl.signerFullname" -}}
{{- printf "%s-signer" (include "ocmfl.fullname" . | trunc 56 | trimSuffix "-") -}}
{{- end -}}

{{- define "ocmfl.signerServiceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ocmfl.signerFullname" .) .Values.signer.serviceAccountName -}}
{{- else -}}
{{- required "signer.serviceAccountName is required when serviceAccount.create is false" .Values.signer.serviceAccountName -}}
{{- end -}}
{{- end -}}

{{- define "ocmfl.signerSelectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: hub-signer
{{- end -}}

{{- define "ocmfl.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "ocmfl.agentImage" -}}
{{- default (include "ocmfl.image" .) .Values.addon.agentImage -}}
{{- end -}}

{{/* Name of the hub CA Secret (the aggregator's server certificate). */}}
{{- define "ocmfl.caSecretName" -}}
{{- default .Values.ca.secretName .Values.ca.existingSecret -}}
{{- end -}}

{{/* Name of the agent CA Secret (agent client certificates, through the hub's CSR signer). */}}
{{- define "ocmfl.agentCASecretName" -}}
{{- default .Values.agentCA.secretName .Values.agentCA.existingSecret -}}
{{- end -}}

{{- define "ocmfl.caInitName" -}}
{{- printf "%s-ca-init" (include "ocmfl.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ocmfl.aggregatorServiceName" -}}
{{- printf "%s-aggregator" (include "ocmfl.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* host:port agents dial. */}}
{{- define "ocmfl.aggregatorAddress" -}}
{{- if .Values.aggregator.externalAddress -}}
{{- .Values.aggregator.externalAddress -}}
{{- else -}}
{{- printf "%s.%s.svc:%d" (include "ocmfl.aggregatorServiceName" .) .Release.Namespace (int .Values.aggregator.port) -}}
{{- end -}}
{{- end -}}

{{/* Name of the AddOnDeploymentConfig (in the release namespace). */}}
{{- define "ocmfl.adcName" -}}
{{- .Values.addon.name -}}
{{- end -}}

{{/* Name of the AddOnTemplate: versioned, so a chart upgrade rolls agents to a new template. */}}
{{- define "ocmfl.templateName" -}}
{{- printf "%s-%s" .Values.addon.name .Chart.Version | replace "+" "-" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* An OCM AddOnTemplate variable reference, {{NAME}}, emitted literally (not Helm syntax). */}}
{{- define "ocmfl.var" -}}
{{- printf "{{%s}}" . -}}
{{- end -}}

{{/* Container security context shared by hub and agent: non-root, read-only root FS. */}}
{{- define "ocmfl.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}
