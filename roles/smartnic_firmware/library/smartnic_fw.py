#!/usr/bin/python
"""Ansible module: query NVIDIA/Mellanox NIC firmware (mstflint) and burn the desired
image where it differs, after verifying the image."""

from __future__ import annotations

DOCUMENTATION = r"""
module: smartnic_fw
short_description: Query and (opt-in) burn ConnectX/BlueField firmware with mstflint
description:
  - Lists the devices (PCI function .0 of vendor 15b3, or the given ones) and reads
    each one's PSID and firmware version with C(mstflint -d DEV q).
  - With I(images), compares each device with the desired version for its PSID. A device
    that differs is burned only when I(burn) is true, and only after the image file's
    SHA-256 matches and C(mstflint -i IMAGE q) shows the device's PSID and the desired
    version. Any mismatch fails the host before anything is written.
  - Check mode reports what would be burned and burns nothing.
options:
  devices:
    description: PCI addresses; empty discovers them.
    type: list
    elements: str
    default: []
  images:
    description:
      - Desired firmware by PSID, C({PSID: {version, sha256}}). Other keys are ignored.
      - The image is read from I(stage_dir)/PSID-VERSION.bin on the node.
    type: dict
    default: {}
  stage_dir:
    description: Where the role staged the images.
    type: path
    default: /var/lib/tacc/firmware
  burn: {description: Allow burning., type: bool, default: false}
author: TACC stack
"""

import hashlib  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

_FIELD = re.compile(r"^(FW Version|PSID):\s+(\S+)", re.M)
_LSPCI = re.compile(r"^(\S+\.0) [0-9a-f]{4}: 15b3:", re.I | re.M)


def parse_query(text: str) -> dict[str, str]:
    """`mstflint q` output (device or image) to {"fw_version", "psid"}."""
    fields = dict(_FIELD.findall(text))
    return {"fw_version": fields.get("FW Version", ""), "psid": fields.get("PSID", "")}


def discover(module: AnsibleModule) -> list[str]:
    lspci = module.get_bin_path("lspci", required=True)
    rc, out, err = module.run_command([lspci, "-D", "-n", "-d", "15b3:"])
    if rc != 0:
        module.fail_json(msg=f"lspci failed: {err.strip()}")
    return _LSPCI.findall(out)


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_image(module: AnsibleModule, mstflint: str, device: dict, image: dict) -> None:
    """Fail the host unless the image file is exactly the one the inventory names."""
    where = f"{device['pci']} (PSID {device['psid']})"
    try:
        actual = sha256_of(image["path"])
    except OSError as exc:
        module.fail_json(msg=f"{where}: cannot read image {image['path']}: {exc.strerror}")
    if actual != image["sha256"].lower():
        module.fail_json(
            msg=f"{where}: image {image['path']} has sha256 {actual}, expected "
            f"{image['sha256']}; nothing burned"
        )
    rc, out, err = module.run_command([mstflint, "-i", image["path"], "q"])
    found = parse_query(out)
    if rc != 0 or found != {"fw_version": image["version"], "psid": device["psid"]}:
        module.fail_json(
            msg=f"{where}: image {image['path']} is {found or err.strip()}, expected PSID "
            f"{device['psid']} version {image['version']}; nothing burned"
        )


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "devices": {"type": "list", "elements": "str", "default": []},
            "images": {"type": "dict", "default": {}},
            "burn": {"type": "bool", "default": False},
            "stage_dir": {"type": "path", "default": "/var/lib/tacc/firmware"},
        },
        supports_check_mode=True,
    )
    mstflint = module.get_bin_path("mstflint", required=True)
    devices = []
    for pci in module.params["devices"] or discover(module):
        rc, out, err = module.run_command([mstflint, "-d", pci, "q"])
        if rc != 0:
            module.fail_json(msg=f"mstflint -d {pci} q failed: {err.strip() or out.strip()}")
        devices.append({"pci": pci, **parse_query(out)})

    results, burned = [], []
    for device in devices:
        image = module.params["images"].get(device["psid"])
        if image is not None:
            staged = f"{module.params['stage_dir']}/{device['psid']}-{image['version']}.bin"
            image = {"version": str(image["version"]), "sha256": image["sha256"], "path": staged}
        result = {**device, "desired": image["version"] if image else None}
        if image is None:
            result["action"] = "no desired firmware for this PSID"
        elif image["version"] == device["fw_version"]:
            result["action"] = "up to date"
        elif not module.params["burn"]:
            result["action"] = "differs; burning is off (smartnic_firmware_burn: true)"
        elif module.check_mode and not os.path.exists(image["path"]):
            result["action"] = "would stage the image and burn"
            burned.append(f"{device['pci']}: {device['fw_version']} -> {image['version']}")
        else:
            verify_image(module, mstflint, device, image)
            if module.check_mode:
                result["action"] = "would burn"
            else:
                argv = [mstflint, "-d", device["pci"], "-i", image["path"], "-y", "burn"]
                rc, out, err = module.run_command(argv)
                if rc != 0:
                    module.fail_json(
                        msg=f"burn of {device['pci']} failed: {err.strip() or out.strip()}",
                        devices=results,
                    )
                result["action"] = "burned"
            burned.append(f"{device['pci']}: {device['fw_version']} -> {image['version']}")
        results.append(result)
    after = {line.split(":")[0]: line.rsplit(" ", 1)[1] for line in burned}
    module.exit_json(
        changed=bool(burned),
        devices=results,
        burned=burned,
        diff={
            "before": "".join(f"{d['pci']} {d['fw_version']}\n" for d in devices),
            "after": "".join(
                f"{d['pci']} {after.get(d['pci'], d['fw_version'])}\n" for d in devices
            ),
        },
    )


if __name__ == "__main__":
    main()
