// Kiln browser runtime: the error classes every module raises (zero dependencies).

/** Base class of the errors this runtime raises for bad packages, devices or inputs. */
export class KilnError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = new.target.name;
  }
}

/** The package is missing, malformed, corrupted, or of a newer format version. */
export class PackageError extends KilnError {}

/** No usable device for the target (no WebGPU, no WebGL2, ...), or it lacks a limit or feature the package needs. */
export class DeviceError extends KilnError {}

/** An input is unknown, missing, or of the wrong dtype or shape. */
export class ShapeError extends KilnError {}
