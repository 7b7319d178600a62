{{- define "skein.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "skein.labels" -}}
app.kubernetes.io/name: skein
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "skein.selector" -}}
app.kubernetes.io/name: skein
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "skein.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "skein.tokenSecret" -}}
{{- .Values.workerToken.existingSecret | default (printf "%s-worker-token" (include "skein.fullname" .)) -}}
{{- end -}}

{{- define "skein.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "skein.storageEnv" -}}
{{- if .Values.storage.existingSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .Values.storage.existingSecret }}
      key: AWS_ACCESS_KEY_ID
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.storage.existingSecret }}
      key: AWS_SECRET_ACCESS_KEY
{{- end }}
{{- if .Values.storage.endpoint }}
- name: AWS_ENDPOINT_URL
  value: {{ .Values.storage.endpoint | quote }}
{{- end }}
{{- end -}}

{{- define "skein.dataVolume" -}}
- name: data
{{- if .Values.sharedData.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.sharedData.existingClaim }}
{{- else }}
  emptyDir: {}
{{- end }}
{{- end -}}

{{- define "skein.checkShared" -}}
{{- if and (not .Values.storage.url) (not .Values.sharedData.existingClaim) -}}
{{- fail "set storage.url (s3://bucket/prefix) or sharedData.existingClaim (a ReadWriteMany claim): the gateway and its workers must share checkpoints and adapter state" -}}
{{- end -}}
{{- if and (gt (int .Values.gateway.replicas) 1) (not .Values.postgres.existingSecret) -}}
{{- fail "gateway.replicas above 1 needs postgres.existingSecret: several gateways share their state (and the leases that say which one sequences each run) in PostgreSQL; without it set gateway.replicas to 1" -}}
{{- end -}}
{{- end -}}
