// Kiln browser runtime: the error classes every module raises (zero dependencies).

/**
 * Base class of the errors this runtime raises for bad packages, devices or inputs. Its message is one line (as
 * kiln.errors.one_line makes the Python runtimes'): line breaks in it, as in a browser's or a parser's message it
 * quotes, are folded into spaces.
 */
export class KilnError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(String(message).replace(/\s*[\r\n]+\s*/g, ' '));
    this.name = new.target.name;
  }
}

/** The package is missing, malformed, corrupted, or of a newer format version. */
export class PackageError extends KilnError {}

/** No usable device for the target (no WebGPU, no WebGL2, ...), or it lacks a limit or feature the package needs. */
export class DeviceError extends KilnError {}

/** An input is unknown, missing, or of the wrong dtype or shape. */
export class ShapeError extends KilnError {}
