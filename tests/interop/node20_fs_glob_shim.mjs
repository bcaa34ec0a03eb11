// node:fs with globSync, for @modelcontextprotocol/conformance on Node 20 (see node20_fs_glob.mjs).
export * from 'node:fs';
export { default } from 'node:fs';
export { globSync } from 'glob';
