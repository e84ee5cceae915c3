// Building child objects: the kind references of common built-in kinds, a skeleton object
// with apiVersion, kind and metadata, and builders for what a stateful app owns: member Pods,
// a Service, a headless Service and a PodDisruptionBudget.
//
// The host sets the namespace and the controller owner reference on every applied child, so a
// plugin only names it. Server-side apply merges by field owner: apply the whole object you
// want each time (an omitted field is removed), never a patch.

import { apiVersion, namespacedKind } from './contract.js';

export const configMapKind = () => namespacedKind('', 'v1', 'ConfigMap', 'configmaps');
export const secretKind = () => namespacedKind('', 'v1', 'Secret', 'secrets');
export const serviceKind = () => namespacedKind('', 'v1', 'Service', 'services');
export const podKind = () => namespacedKind('', 'v1', 'Pod', 'pods');
export const pvcKind = () => namespacedKind('', 'v1', 'PersistentVolumeClaim', 'persistentvolumeclaims');
export const pdbKind = () => namespacedKind('policy', 'v1', 'PodDisruptionBudget', 'poddisruptionbudgets');

/**
 * A child of `kind` named `name` with `labels` (an object) and the top-level `fields`
 * (`{ data }` for a ConfigMap, `{ spec }` for a Pod) merged in.
 */
export function childObject(kind, name, labels = {}, fields = {}) {
  return {
    apiVersion: apiVersion(kind),
    kind: kind.kind,
    metadata: { name, labels: { ...labels } },
    ...fields,
  };
}

/** A Pod, built up: `new Pod(name).label(k, v).container(new Container(n, image)...).build()`. */
export class Pod {
  constructor(name) {
    this.name = name;
    this.labels = {};
    this.annotations = {};
    this.spec = {};
    this.containers = [];
    this.volumes = [];
  }

  label(key, value) {
    this.labels[key] = value;
    return this;
  }

  annotation(key, value) {
    this.annotations[key] = value;
    return this;
  }

  container(container) {
    this.containers.push(container.build());
    return this;
  }

  /** Reachable as `<name>.<service>` through a headless Service (hostname and subdomain). */
  stableDns(service) {
    this.spec.hostname = this.name;
    this.spec.subdomain = service;
    return this;
  }

  emptyDirVolume(volume) {
    this.volumes.push({ name: volume, emptyDir: {} });
    return this;
  }

  claimVolume(volume, claim) {
    this.volumes.push({ name: volume, persistentVolumeClaim: { claimName: claim } });
    return this;
  }

  /** Sets `spec.<key>` (`restartPolicy`, `securityContext`, ...). */
  specField(key, value) {
    this.spec[key] = value;
    return this;
  }

  build() {
    const spec = { ...this.spec, containers: this.containers };
    if (this.volumes.length > 0) spec.volumes = this.volumes;
    const pod = childObject(podKind(), this.name, this.labels, { spec });
    if (Object.keys(this.annotations).length > 0) pod.metadata.annotations = { ...this.annotations };
    return pod;
  }
}

/** One container of a Pod. */
export class Container {
  constructor(name, image) {
    this.object = { name, image };
  }

  args(args) {
    this.object.args = [...args];
    return this;
  }

  /** A named TCP port: the name is what the capability and the admin's grant say. */
  port(name, number) {
    (this.object.ports ??= []).push({ name, containerPort: number, protocol: 'TCP' });
    return this;
  }

  env(name, value) {
    (this.object.env ??= []).push({ name, value });
    return this;
  }

  mount(volume, path) {
    (this.object.volumeMounts ??= []).push({ name: volume, mountPath: path });
    return this;
  }

  /** Ready while a TCP connection to the port named `port` opens. */
  readyOnTcp(port) {
    this.object.readinessProbe = { tcpSocket: { port }, periodSeconds: 2 };
    return this;
  }

  /** Sets `<key>` on the container (`resources`, `securityContext`, ...). */
  field(key, value) {
    this.object[key] = value;
    return this;
  }

  build() {
    return JSON.parse(JSON.stringify(this.object));
  }
}

const servicePorts = (ports) =>
  ports.map(([name, port]) => ({ name, port, targetPort: name, protocol: 'TCP' }));

/** A ClusterIP Service over the Pods with the `selector` labels; `ports` are `[name, number]`. */
export function service(name, selector, ports, labels = {}) {
  return childObject(serviceKind(), name, labels, {
    spec: { selector: { ...selector }, ports: servicePorts(ports) },
  });
}

/** A headless Service: a DNS name per Pod (`<pod>.<name>`), published before Pods are ready. */
export function headlessService(name, selector, ports, labels = {}) {
  return childObject(serviceKind(), name, labels, {
    spec: {
      clusterIP: 'None',
      publishNotReadyAddresses: true,
      selector: { ...selector },
      ports: servicePorts(ports),
    },
  });
}

/**
 * A PodDisruptionBudget: at least `minAvailable` of the selected Pods stay up through voluntary
 * evictions. `minAvailable`, never `maxUnavailable`, as the Rust SDK's `disruption_budget`: a
 * plugin's Pods are owned by its parent, a custom resource, and Kubernetes reads
 * `maxUnavailable` against the owner's scale subresource, which a kind may not have; the budget
 * then never syncs and guards nothing. An integer `minAvailable` needs no owner at all.
 */
export function disruptionBudget(name, selector, minAvailable, labels = {}) {
  return childObject(pdbKind(), name, labels, {
    spec: { minAvailable, selector: { matchLabels: { ...selector } } },
  });
}
