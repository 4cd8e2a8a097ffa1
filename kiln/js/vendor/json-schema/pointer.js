export function encodePointer(p) {
    return encodeURI(escapePointer(p)).replace(/#/g, '%23');
}
export function escapePointer(p) {
    return p.replace(/~/g, '~0').replace(/\//g, '~1');
}
//# sourceMappingURL=pointer.js.map