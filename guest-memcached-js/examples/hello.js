// The smallest plugin on the JS SDK, as README.md's "Write a plugin" shows it: a ConfigMap per
// parent. test/examples.test.js runs it, so the README's example cannot rot unnoticed.
import { Action, children, decision, namespacedKind } from '../sdk/index.js';

export const helloPlugin = {
  describe() {
    return {
      name: 'hello',
      version: '0.1.0',
      target: namespacedKind('example.com', 'v1', 'Hello', 'hellos'),
      children: [children.configMapKind()],
      capabilities: [],
      wantsFinalizer: false,
    };
  },
  reconcile(observation, app) {
    const name = observation.parentName();
    const map = children.childObject(children.configMapKind(), `${name}-hello`, {}, { data: { greeting: 'hello' } });
    return decision([Action.apply(map)]);
  },
};
