// The component's entry module: exports the memcached plugin as the `policy` interface of
// world `policy-host:policy/policy-plugin@0.2.2`, deciding through the host's imports. Only
// this module (through ../sdk/host.js) imports the WIT; tests import ./memcached.js.

import { exportPlugin } from '../sdk/export.js';
import { hostApp } from '../sdk/host.js';
import { memcachedPlugin } from './memcached.js';

export const policy = exportPlugin(memcachedPlugin, hostApp);
