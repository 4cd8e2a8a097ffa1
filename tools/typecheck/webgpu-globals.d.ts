// WebGPU's flag namespaces (WebGPU spec: GPUBufferUsage, GPUMapMode, GPUShaderStage), which TypeScript's lib.dom
// declares the flag types of but not the constants. Only for type-checking kiln/js (see tsconfig.json).
declare const GPUBufferUsage: {
  readonly MAP_READ: number;
  readonly MAP_WRITE: number;
  readonly COPY_SRC: number;
  readonly COPY_DST: number;
  readonly INDEX: number;
  readonly VERTEX: number;
  readonly UNIFORM: number;
  readonly STORAGE: number;
  readonly INDIRECT: number;
  readonly QUERY_RESOLVE: number;
};
declare const GPUMapMode: {readonly READ: number; readonly WRITE: number};
declare const GPUShaderStage: {readonly VERTEX: number; readonly FRAGMENT: number; readonly COMPUTE: number};
