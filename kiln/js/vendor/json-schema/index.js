export * from './deep-compare-strict.js';
export * from './dereference.js';
export * from './format.js';
export * from './pointer.js';
export * from './types.js';
export * from './ucs2-length.js';
export * from './validate.js';
export * from './validator.js';
//# sourceMappingURL=index.js.map