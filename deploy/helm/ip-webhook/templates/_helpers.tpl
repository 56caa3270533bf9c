{{/* Names */}}
{{- define "ip-webhook.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ip-webhook.fullname" -}}
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

{{- define "ip-webhook.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "ip-webhook.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.global.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* metadata.annotations: global.commonAnnotations merged with (dict "root" $ "extra" DICT),
     the extra ones winning; nothing when both are empty. Use with `with include ... nindent`. */}}
{{- define "ip-webhook.annotations" -}}
{{- $all := merge (dict) (.extra | default dict) (.root.Values.global.commonAnnotations | default dict) }}
{{- with $all }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* REGISTRY/REPOSITORY@DIGEST, or REGISTRY/REPOSITORY:TAG (TAG defaults to appVersion). */}}
{{- define "ip-webhook.image" -}}
{{- $image := .Values.image }}
{{- $name := ternary (printf "%s/%s" $image.registry $image.repository) $image.repository (ne $image.registry "") }}
{{- if $image.digest }}
{{- printf "%s@%s" $name $image.digest }}
{{- else }}
{{- printf "%s:%s" $name (default .Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{- define "ip-webhook.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ip-webhook.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ip-webhook.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ip-webhook.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The fixed names of the serving certificate (documented: made outside the chart when
     validatingWebhook.certificate.create is false). */}}
{{- define "ip-webhook.certificateName" -}}
{{- printf "%s-serving-cert" (include "ip-webhook.fullname" .) }}
{{- end }}
{{- define "ip-webhook.secretName" -}}
{{- printf "%s-tls" (include "ip-webhook.fullname" .) }}
{{- end }}
{{- define "ip-webhook.issuerName" -}}
{{- printf "%s-selfsigned-issuer" (include "ip-webhook.fullname" .) }}
{{- end }}

{{/* "true" when some webhook configuration is rendered, so the server and its certificate are. */}}
{{/* The container's ports: server.port and server.adminPort, else 8443 and 8080, or on the
     node's network (hostNetwork) 10260 and 10261, next to the kubelet's 10250. */}}
{{- define "ip-webhook.port" -}}
{{- .Values.server.port | default (ternary 10260 8443 .Values.hostNetwork) }}
{{- end }}
{{- define "ip-webhook.adminPort" -}}
{{- .Values.server.adminPort | default (ternary 10261 8080 .Values.hostNetwork) }}
{{- end }}

{{/* Refuse the keys other charts use for what this chart spells otherwise, naming the key to
     use (files/other-spellings.yaml; the schema lets them through to here). */}}
{{- define "ip-webhook.checkSpellings" -}}
{{- $spellings := .Files.Get "files/other-spellings.yaml" | fromYaml }}
{{- range $key, $spelling := $spellings }}
{{- if hasKey $.Values $key }}
{{- fail (printf "%s is not a value of this chart. For %s, use %s. The chart's README maps other charts' keys to this chart's" $key (get $spelling "for") $spelling.use) }}
{{- end }}
{{- end }}
{{- end }}

{{- define "ip-webhook.serving" -}}
{{- if or .Values.mutatingWebhook.enabled .Values.validatingWebhook.enabled }}true{{ end }}
{{- end }}

{{- define "ip-webhook.certManager" -}}
{{- if and (include "ip-webhook.serving" .) (eq .Values.validatingWebhook.certificate.source "cert-manager") }}true{{ end }}
{{- end }}

{{/* The service's DNS names, shortest first: the certificate's SANs. */}}
{{- define "ip-webhook.dnsNames" -}}
{{- $svc := include "ip-webhook.fullname" . -}}
{{- $ns := .Release.Namespace -}}
- {{ $svc }}
- {{ printf "%s.%s" $svc $ns }}
- {{ printf "%s.%s.svc" $svc $ns }}
- {{ printf "%s.%s.svc.%s" $svc $ns .Values.clusterDomain }}
{{- end }}

{{/* matchConditions are GA from Kubernetes 1.30; before that, an objectSelector on the label.
     One switch for every pod and workload entry of both webhooks. */}}
{{- define "ip-webhook.useMatchConditions" -}}
{{- $mode := .Values.mutatingWebhook.podSelection }}
{{- if or (eq $mode "matchConditions") (and (eq $mode "auto") (semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version)) }}true{{ end }}
{{- end }}

{{/* The namespaceSelector of a namespaced webhook entry: (dict "root" $ "entry" NAME).
     Unless overridden, the webhooks never see their own namespace, kube-system, or the
     listed ones. pod-deletes and pod-updates fall back to pod CREATE's selector, so the pods
     given an IP are the ones whose release and updates are seen. */}}
{{- define "ip-webhook.namespaceSelector" -}}
{{- $ := .root }}
{{- $m := $.Values.mutatingWebhook }}
{{- $v := $.Values.validatingWebhook }}
{{- $selector := dict }}
{{- if eq .entry "pods.mutate" }}
{{- $selector = $m.namespaceSelector }}
{{- else if eq .entry "pod-deletes.mutate" }}
{{- $selector = $m.deleteNamespaceSelector | default $m.namespaceSelector }}
{{- else if eq .entry "pods.validate" }}
{{- $selector = $v.pods.namespaceSelector }}
{{- else if eq .entry "pod-updates.validate" }}
{{- $selector = $v.podUpdates.namespaceSelector | default $m.namespaceSelector }}
{{- else if eq .entry "workloads" }}
{{- $selector = $v.workloads.namespaceSelector }}
{{- else }}
{{- fail (printf "ip-webhook.namespaceSelector: unknown entry %s" .entry) }}
{{- end }}
namespaceSelector:
{{- if $selector }}
  {{- toYaml $selector | nindent 2 }}
{{- else }}
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values:
        {{- toYaml (concat (list $.Release.Namespace "kube-system") $.Values.excludeNamespaces | uniq) | nindent 8 }}
{{- end }}
{{- end }}

{{/* The Secret the server serves from. */}}
{{- define "ip-webhook.servingSecret" -}}
{{- if eq .Values.validatingWebhook.certificate.source "existing" }}
{{- required "validatingWebhook.certificate.source=existing needs validatingWebhook.certificate.existingSecret: the kubernetes.io/tls Secret (tls.crt, tls.key) in the release namespace" .Values.validatingWebhook.certificate.existingSecret }}
{{- else }}
{{- include "ip-webhook.secretName" . }}
{{- end }}
{{- end }}

{{/* Generated CA and certificate for certificate.source=helm: made once per render (cached in
     the values tree, shared by the Secret and both webhook configurations) and kept across
     upgrades by reading back the Secret already in the cluster. */}}
{{- define "ip-webhook.helmTLS" -}}
{{- if not (hasKey .Values "generatedTLS") }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "ip-webhook.secretName" .) }}
{{- $tls := dict }}
{{- if and $existing $existing.data (hasKey $existing.data "ca.crt") (hasKey $existing.data "tls.crt") (hasKey $existing.data "tls.key") }}
{{- $tls = dict "ca" (index $existing.data "ca.crt" | b64dec) "cert" (index $existing.data "tls.crt" | b64dec) "key" (index $existing.data "tls.key" | b64dec) }}
{{- else }}
{{- $days := int .Values.validatingWebhook.certificate.validityDays }}
{{- $ca := genCA (printf "%s-ca" (include "ip-webhook.fullname" .)) $days }}
{{- $svc := printf "%s.%s.svc" (include "ip-webhook.fullname" .) .Release.Namespace }}
{{- $cert := genSignedCert $svc nil (include "ip-webhook.dnsNames" . | fromYamlArray) $days $ca }}
{{- $tls = dict "ca" $ca.Cert "cert" $cert.Cert "key" $cert.Key }}
{{- end }}
{{- $_ := set .Values "generatedTLS" $tls }}
{{- end }}
{{- toYaml .Values.generatedTLS }}
{{- end }}

{{/* metadata.annotations of a webhook configuration (cert-manager injects caBundle). */}}
{{- define "ip-webhook.webhookAnnotations" -}}
{{- $extra := dict }}
{{- if include "ip-webhook.certManager" . }}
{{- $_ := set $extra "cert-manager.io/inject-ca-from" (printf "%s/%s" .Release.Namespace (include "ip-webhook.certificateName" .)) }}
{{- end }}
{{- include "ip-webhook.annotations" (dict "root" . "extra" $extra) }}
{{- end }}

{{/* clientConfig for path (dict "root" $ "path" "/mutate"). */}}
{{- define "ip-webhook.clientConfig" -}}
{{- $ := .root -}}
clientConfig:
  service:
    name: {{ include "ip-webhook.fullname" $ }}
    namespace: {{ $.Release.Namespace }}
    path: {{ .path }}
    port: {{ $.Values.service.port }}
  {{- if eq $.Values.validatingWebhook.certificate.source "helm" }}
  caBundle: {{ (include "ip-webhook.helmTLS" $ | fromYaml).ca | b64enc }}
  {{- else if eq $.Values.validatingWebhook.certificate.source "existing" }}
  caBundle: {{ required "validatingWebhook.certificate.source=existing needs validatingWebhook.certificate.caBundle: base64 of the PEM CA that signed the Secret's certificate" $.Values.validatingWebhook.certificate.caBundle }}
  {{- end }}
{{- end }}

{{/* CEL: the pod asks for an IP from us (allocation list, pool, hand-written static IP, or
     the opt-in label). Every step is guarded with has() so no pod can make it error. */}}
{{- define "ip-webhook.celPodWantsIP" -}}
{{- $o := . -}}
{{ $o }} != null && has({{ $o }}.metadata) && ((has({{ $o }}.metadata.annotations) && ('ip-webhook.io/allocatable-ips' in {{ $o }}.metadata.annotations || 'ip-webhook.io/ip-pool' in {{ $o }}.metadata.annotations || 'cni.projectcalico.org/ipAddrs' in {{ $o }}.metadata.annotations || 'cni.projectcalico.org/ipAddrsNoIpam' in {{ $o }}.metadata.annotations || 'ovn.kubernetes.io/ip_address' in {{ $o }}.metadata.annotations)) || (has({{ $o }}.metadata.labels) && 'ip-webhook.io/fixed-ip' in {{ $o }}.metadata.labels))
{{- end }}

{{/* CEL, as a further alternative (` || (...)`): with server.networks set, the pod attaches
     Multus networks or names a list for one (`NAME.NAMESPACE.ip-webhook.io/allocatable-ips`):
     /mutate gives it its IPs there, and checks a hand-named `ips` entry. Without, nothing, so
     no Multus pod waits on the webhook. Argument: (dict "root" $ "o" "object"). */}}
{{- define "ip-webhook.celPodOnNetworks" -}}
{{- $o := .o -}}
{{- if .root.Values.server.networks -}}
{{ " || " }}({{ $o }} != null && has({{ $o }}.metadata) && has({{ $o }}.metadata.annotations) && ('k8s.v1.cni.cncf.io/networks' in {{ $o }}.metadata.annotations || {{ $o }}.metadata.annotations.exists(k, k.endsWith('.ip-webhook.io/allocatable-ips'))))
{{- end }}
{{- end }}

{{/* CEL: the pod carries a label or annotation key of ours (`ip-webhook.io/...`), known or
     not: /mutate sees it, so a mistyped key gets a warning naming the known one instead of
     being ignored in silence. Argument: object or oldObject. */}}
{{- define "ip-webhook.celPodHasOurKey" -}}
{{- $o := . -}}
{{ $o }} != null && has({{ $o }}.metadata) && ((has({{ $o }}.metadata.annotations) && {{ $o }}.metadata.annotations.exists(k, k.startsWith('ip-webhook.io/'))) || (has({{ $o }}.metadata.labels) && {{ $o }}.metadata.labels.exists(k, k.startsWith('ip-webhook.io/'))))
{{- end }}

{{/* CEL: the deleted pod may hold an IP in our books: a static IP, the allocated label, or
     any other of our marks (marker, claim token), so a pod stripped of some still has its
     DELETE seen (the server finds its claims by UID and token). */}}
{{- define "ip-webhook.celPodHoldsIP" -}}
oldObject != null && has(oldObject.metadata) && ((has(oldObject.metadata.labels) && ('ip-webhook.io/allocated-ip' in oldObject.metadata.labels || 'ip-webhook.io/fixed-ip' in oldObject.metadata.labels)) || (has(oldObject.metadata.annotations) && ('cni.projectcalico.org/ipAddrs' in oldObject.metadata.annotations || 'cni.projectcalico.org/ipAddrsNoIpam' in oldObject.metadata.annotations || 'ovn.kubernetes.io/ip_address' in oldObject.metadata.annotations || 'ip-webhook.io/status' in oldObject.metadata.annotations || 'ip-webhook.io/claim' in oldObject.metadata.annotations)))
{{- end }}

{{/* CEL: the pod carries ip-webhook's own marks (allocated label, marker, claim token), which
     only a granted admission writes: it holds a claim. Argument: object or oldObject. */}}
{{- define "ip-webhook.celPodMarked" -}}
{{- $o := . -}}
{{ $o }} != null && has({{ $o }}.metadata) && ((has({{ $o }}.metadata.labels) && 'ip-webhook.io/allocated-ip' in {{ $o }}.metadata.labels) || (has({{ $o }}.metadata.annotations) && ('ip-webhook.io/status' in {{ $o }}.metadata.annotations || 'ip-webhook.io/claim' in {{ $o }}.metadata.annotations)))
{{- end }}

{{/* CEL for pods.validate: the pod asks for an IP or names one (before or after an update, or
     in a Kube-OVN ip_pool list), and is not one of ours already (those go to
     pod-updates.validate, which fails closed). */}}
{{- define "ip-webhook.celPodValidates" -}}
(({{ include "ip-webhook.celPodWantsIP" "object" }}) || ({{ include "ip-webhook.celPodWantsIP" "oldObject" }}){{ include "ip-webhook.celPodOnNetworks" (dict "root" . "o" "object") }} || (object != null && has(object.metadata) && has(object.metadata.annotations) && 'ovn.kubernetes.io/ip_pool' in object.metadata.annotations)) && !({{ include "ip-webhook.celPodMarked" "oldObject" }})
{{- end }}

{{- define "ip-webhook.objectSelector" -}}
objectSelector:
  matchExpressions:
    - key: ip-webhook.io/fixed-ip
      operator: Exists
{{- end }}

{{/* CEL: a workload's pod template (spec.template, or a CronJob's
     spec.jobTemplate.spec.template) carries an IP list or pool (ours, or a Kube-OVN ip_pool);
     argument: object or oldObject. */}}
{{- define "ip-webhook.celWorkloadAsksIP" -}}
{{- $o := . -}}
{{- $asks := "('ip-webhook.io/allocatable-ips' in %[1]s.metadata.annotations || 'ip-webhook.io/ip-pool' in %[1]s.metadata.annotations || 'ovn.kubernetes.io/ip_pool' in %[1]s.metadata.annotations)" -}}
{{- $t := printf "%s.spec.template" $o -}}
{{- $j := printf "%s.spec.jobTemplate.spec.template" $o -}}
{{ $o }} != null && has({{ $o }}.spec) && ((has({{ $t }}) && has({{ $t }}.metadata) && has({{ $t }}.metadata.annotations) && {{ printf $asks $t }}) || (has({{ $o }}.spec.jobTemplate) && has({{ $o }}.spec.jobTemplate.spec) && has({{ $j }}) && has({{ $j }}.metadata) && has({{ $j }}.metadata.annotations) && {{ printf $asks $j }}))
{{- end }}

{{/* rbac.calico / rbac.kubeOvn: unset (null) follows server.cni; the CNI pool checks need it too. */}}
{{- define "ip-webhook.rbacCalico" -}}
{{- $set := .Values.rbac.calico }}
{{- if or .Values.validatingWebhook.calicoIPPools.enabled (ternary (eq .Values.server.cni "calico") $set (kindIs "invalid" $set)) }}true{{ end }}
{{- end }}
{{- define "ip-webhook.rbacKubeOvn" -}}
{{- $set := .Values.rbac.kubeOvn }}
{{- if or .Values.validatingWebhook.kubeOvnSubnets.enabled (ternary (eq .Values.server.cni "kube-ovn") $set (kindIs "invalid" $set)) }}true{{ end }}
{{- end }}

{{/* The state volume's claim: the existing one, or the one the chart makes. */}}
{{- define "ip-webhook.claimName" -}}
{{- default (printf "%s-state" (include "ip-webhook.fullname" .)) .Values.persistence.existingClaim }}
{{- end }}

{{/* Refuse settings that would hand out an IP twice, saying why. */}}
{{- define "ip-webhook.checkValues" -}}
{{- if eq .Values.server.ledger "embedded" }}
{{- if ne (int .Values.replicaCount) 1 }}
{{- fail (printf "server.ledger=embedded needs replicaCount=1 (got %d): each pod keeps its own books in its own volume, so several replicas would hand out the same IPs. Use server.ledger=kubernetes (or etcd) for several replicas" (int .Values.replicaCount)) }}
{{- end }}
{{- if not .Values.persistence.enabled }}
{{- fail "server.ledger=embedded needs persistence.enabled=true: on the default emptyDir the books vanish with the pod, and the next pod hands out IPs that running pods still hold. Set persistence.enabled=true (and persistence.storageClass or persistence.existingClaim)" }}
{{- end }}
{{- end }}
{{- if lt (int .Values.replicaCount) 1 }}
{{- fail "replicaCount=0 leaves no replica to answer the webhooks: every pod that asks for a fixed IP would be refused (mutatingWebhook.failurePolicy Fail), or started on a random IP (Ignore). Keep 1 or more; to stop the webhook, set mutatingWebhook.enabled=false and validatingWebhook.enabled=false (docs/install.md, Uninstall)" }}
{{- end }}
{{- if and .Values.persistence.enabled (not (include "ip-webhook.sharedClaim" .)) (gt (int .Values.replicaCount) 1) }}
{{- fail (printf "persistence.enabled with replicaCount=%d needs persistence.accessModes with ReadWriteMany: a %s claim mounts on one node only, so the other replicas would never start" (int .Values.replicaCount) (join "," .Values.persistence.accessModes)) }}
{{- end }}
{{- end }}

{{/* "true" when the state claim can be mounted by pods on several nodes at once. */}}
{{- define "ip-webhook.sharedClaim" -}}
{{- if has "ReadWriteMany" .Values.persistence.accessModes }}true{{ end }}
{{- end }}

{{/* Recreate when one pod at a time may hold the state: the embedded ledger's books, or a
     claim that mounts on one node only. */}}
{{- define "ip-webhook.recreate" -}}
{{- if or (eq .Values.server.ledger "embedded") (and .Values.persistence.enabled (not (include "ip-webhook.sharedClaim" .))) }}true{{ end }}
{{- end }}
