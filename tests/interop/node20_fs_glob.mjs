// Node 20 has no fs.globSync (Node 22 added it), which @modelcontextprotocol/conformance's dist imports
// by name. Preloaded with `node --import ./node20_fs_glob.mjs`, this resolve hook hands the suite's own
// `fs` imports a module that is node:fs plus globSync from the `glob` package; nothing else is touched.
import { register } from 'node:module';

if (!(await import('node:fs')).globSync) {
  register('./node20_fs_glob.mjs', import.meta.url);
}

const SHIM = new URL('./node20_fs_glob_shim.mjs', import.meta.url).href;

export async function resolve(specifier, context, nextResolve) {
  if ((specifier === 'fs' || specifier === 'node:fs') && context.parentURL?.includes('/@modelcontextprotocol/conformance/')) {
    return { url: SHIM, shortCircuit: true };
  }
  return nextResolve(specifier, context);
}
